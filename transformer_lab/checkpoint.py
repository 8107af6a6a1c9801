"""Checkpoints for the capstone (chapter 8): ``safetensors`` for tensors, JSON for everything else.

A checkpoint is addressed by its JSON file ``NAME.json``. The JSON holds the format tag, the model config, the
training step, the optimizer's hyper-parameters and scalar state, the RNG states, the corpus hash, the loss
history, and the name and sha256 of its tensor file ``NAME.<hash16>.safetensors`` (weights, optimizer moments).

Writing is atomic: the tensor file is written under a temporary name and renamed to its content-addressed name,
then the JSON is written the same way; an interrupted save leaves the previous checkpoint intact. A save refuses
non-finite weights or numbers (the JSON is strict: no bare ``NaN``), so a diverged run never replaces a good
checkpoint, and afterwards removes only this checkpoint's own earlier tensor files (``NAME.<16 hex>.safetensors``,
never another checkpoint's ``NAME.best.<hash>.safetensors``). Loading checks the format tag, the type of every
entry it uses, the file hash (a truncated or swapped file is caught), and every tensor's name, shape and
finiteness against the model before anything is copied; nothing is ever unpickled (``safetensors`` stores raw
arrays, JSON stores text). :class:`Lock` keeps two trainers from writing one checkpoint.

Checkpoints are device-independent: tensors are copied to the CPU before they are written, and :func:`read`
places them on any device (``device=``, as ``torch.load``'s ``map_location``); copying into a model or optimizer
moves them to its parameters' device.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

FORMAT = "transformer_lab.checkpoint"
VERSION = 1
MAX_JSON_BYTES = 64 * 2**20
"""The largest checkpoint JSON :func:`read` accepts (a run's history is a few hundred kB at most)."""
_SHA256 = re.compile(r"[0-9a-f]{64}")


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, foreign, or does not match the model it is loaded into."""


def _atomic_write(path: Path, write) -> None:
    """Call ``write(tmp_path)``, flush it to disk, and rename it over ``path`` (atomic on POSIX)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _own_weights(jpath: Path) -> re.Pattern:
    """The names of the tensor files that saves to ``jpath`` write: ``STEM.<16 hex>.safetensors``, nothing else."""
    return re.compile(re.escape(jpath.stem) + r"\.[0-9a-f]{16}\.safetensors")


def _strict_json(obj: Any) -> str:
    try:
        return json.dumps(obj, indent=1, sort_keys=False, allow_nan=False)
    except ValueError as exc:  # NaN or inf somewhere in the record
        raise CheckpointError(f"refusing to save a checkpoint holding a non-finite number ({exc})") from exc


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def json_path(path: str | Path) -> Path:
    """``foo``, ``foo.json`` -> ``foo.json`` (a checkpoint is named by its JSON file)."""
    path = Path(path)
    return path if path.suffix == ".json" else path.with_name(path.name + ".json")


def encode_rng(state: torch.Tensor) -> str:
    """A generator state (uint8 tensor) as base64 text for the JSON."""
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def decode_rng(text: str) -> torch.Tensor:
    """The inverse of :func:`encode_rng`; raises ValueError (or TypeError for a non-string) on anything else."""
    if not isinstance(text, str):
        raise TypeError(f"a generator state is base64 text, got {type(text).__name__}")
    raw = base64.b64decode(text.encode("ascii", errors="replace"), validate=True)
    if not raw:
        raise ValueError("an empty generator state")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with each shared (tied) tensor stored once, under its first name."""
    seen: dict[int, str] = {}
    out = {}
    for name, t in model.state_dict(keep_vars=False).items():
        key = t.data_ptr()
        if key in seen and t.numel():
            continue
        seen[key] = name
        out[name] = t.detach().to("cpu", copy=True).contiguous()  # on disk, a tensor belongs to no device
    return out


def _param_order(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> list[str]:
    """The model's names of the optimizer's parameters, in the optimizer's order (its state is indexed by it)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def save(path: str | Path, *, model: torch.nn.Module, meta: dict[str, Any],
         optimizer: torch.optim.Optimizer | None = None) -> Path:
    """Write ``model`` (and ``optimizer``'s state, if given) with the JSON-able ``meta``; returns the JSON path.

    ``meta`` should hold at least ``config`` (the model config as a dict); the trainer adds ``step``, ``rng``,
    ``corpus_sha256`` and ``history``.
    """
    jpath = json_path(path)
    tensors = {f"model.{k}": v for k, v in model_tensors(model).items()}
    bad = [k for k, v in tensors.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise CheckpointError(f"refusing to save {jpath}: the weights hold NaN or inf ({', '.join(bad[:3])}); "
                              "the checkpoint already there is kept")
    optim_json = None
    if optimizer is not None:
        sd = optimizer.state_dict()
        order = _param_order(optimizer, model)
        scalars: dict[str, dict[str, Any]] = {}
        for idx, st in sd["state"].items():
            pname = order[idx]
            for k, v in st.items():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    tensors[f"optimizer.{pname}.{k}"] = v.detach().to("cpu", copy=True).contiguous()
                else:
                    kind = "tensor" if isinstance(v, torch.Tensor) else type(v).__name__
                    scalars.setdefault(pname, {})[k] = {"value": float(v), "kind": kind}
        groups = [{k: v for k, v in g.items() if k != "params"} | {"params": [order[i] for i in g["params"]]}
                  for g in sd["param_groups"]]
        optim_json = {"param_groups": groups, "scalars": scalars}
    data = safetensors_bytes(tensors, metadata={"format": FORMAT})  # the file's bytes, hashed before writing
    digest = hashlib.sha256(data).hexdigest()
    wname = f"{jpath.stem}.{digest[:16]}.safetensors"
    wpath = jpath.parent / wname
    record = {"format": FORMAT, "version": VERSION, "weights": wname, "weights_sha256": digest,
              "optimizer": optim_json, **meta}
    text = _strict_json(record)  # before any file is written
    jpath.parent.mkdir(parents=True, exist_ok=True)
    new_file = not wpath.exists()  # the same weights saved again keep their name
    _atomic_write(wpath, lambda p: Path(p).write_bytes(data))
    try:
        _atomic_write(jpath, lambda p: Path(p).write_text(text, encoding="utf-8"))
    except BaseException:  # the previous JSON still names the previous weights: drop the new, unreferenced file
        if new_file:
            wpath.unlink(missing_ok=True)
        raise
    own, kept = _own_weights(jpath), _named_beside(jpath)
    for old in jpath.parent.glob(f"{glob_escape(jpath.stem)}.*.safetensors"):  # earlier saves of this checkpoint
        if old.name != wname and own.fullmatch(old.name) and old.name not in kept:
            old.unlink(missing_ok=True)
    return jpath


def _named_beside(jpath: Path) -> set[str]:
    """The weights files that the other JSON files beside ``jpath`` name: a copy of a checkpoint's JSON
    (``cp a.json backup.json``) keeps its weights when ``a.json`` is saved again."""
    names = set()
    for other in jpath.parent.glob("*.json"):
        try:
            if other.name == jpath.name or other.stat().st_size > MAX_JSON_BYTES:
                continue
            record = json.loads(other.read_bytes())
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(record, dict) and isinstance(record.get("weights"), str):
            names.add(record["weights"])
    return names


def glob_escape(name: str) -> str:
    """``name`` with the glob metacharacters ``*?[`` quoted, so that it matches only itself."""
    return re.sub(r"([*?[])", r"[\1]", name)


def read(path: str | Path, *, device: str | torch.device = "cpu") -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read and verify a checkpoint: returns (the JSON record, its tensors on ``device``). Raises
    :class:`CheckpointError`."""
    jpath = json_path(path)
    for p in (Path(path), jpath):
        if p.is_dir():
            raise CheckpointError(f"{p} is a directory, not a checkpoint NAME.json")
    if not jpath.is_file():
        raise CheckpointError(f"no checkpoint at {jpath}")
    try:
        size = jpath.stat().st_size
        if size > MAX_JSON_BYTES:
            raise CheckpointError(f"{jpath} is not a transformer_lab checkpoint: {size:,} bytes, more than the "
                                  f"{MAX_JSON_BYTES:,} a checkpoint's JSON can hold")
        record = json.loads(jpath.read_bytes().decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{jpath} is not a transformer_lab checkpoint (not valid JSON: {exc}); "
                              "checkpoints are never unpickled") from exc
    except OSError as exc:
        raise CheckpointError(f"{jpath} cannot be read: {exc}") from exc
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CheckpointError(f"{jpath} is not a transformer_lab checkpoint (its 'format' is not {FORMAT!r})")
    if type(record.get("version")) is not int or record["version"] != VERSION:  # not 1.0, not true
        raise CheckpointError(f"{jpath} has checkpoint version {record.get('version')!r}; this code reads {VERSION}")
    for key in ("weights", "weights_sha256", "config"):
        if key not in record:
            raise CheckpointError(f"{jpath} is incomplete: it has no {key!r} entry")
    weights, sha = record["weights"], record["weights_sha256"]
    if not isinstance(weights, str) or not weights.endswith(".safetensors") or Path(weights).name != weights:
        raise CheckpointError(f"{jpath}: 'weights' must be the file name NAME.<hash>.safetensors of a file beside "
                              f"it, got {_short(weights)}")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise CheckpointError(f"{jpath}: 'weights_sha256' must be 64 lowercase hex digits, got {_short(sha)}")
    if not isinstance(record["config"], dict):
        raise CheckpointError(f"{jpath}: 'config' must be a JSON object (the model config), got "
                              f"{_short(record['config'])}")
    wpath = jpath.parent / weights
    if not wpath.is_file():
        raise CheckpointError(f"{jpath} names the weights file {wpath.name}, which is missing")
    try:
        digest = _file_sha256(wpath)
    except OSError as exc:
        raise CheckpointError(f"{wpath} cannot be read: {exc}") from exc
    if digest != record["weights_sha256"]:
        raise CheckpointError(f"{wpath} is truncated or corrupt: its sha256 is {digest[:16]}..., the checkpoint "
                              f"records {record['weights_sha256'][:16]}...")
    try:
        tensors = load_file(wpath, device=str(torch.device(device)))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:  # RuntimeError: replaced while read
        raise CheckpointError(f"{wpath} is not a readable safetensors file (if a run is saving it, try again): "
                              f"{exc}") from exc
    return record, tensors


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def expected_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the tensors :func:`save` stores for ``model`` (a tied tensor once, under its first name).

    Works on a model built on the ``meta`` device, so a checkpoint's tensors can be checked against a config
    before any memory is allocated for it."""
    seen: set[int] = set()
    out = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            continue
        seen.add(id(t))
        out[name] = tuple(t.shape)
    return out


def check_model_state(want: dict[str, tuple[int, ...]], tensors: dict[str, torch.Tensor], *,
                      source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """The ``model.*`` tensors of a checkpoint, checked against ``want`` (name -> shape): names, shapes, dtypes
    and finiteness. Raises :class:`CheckpointError`; touches no model."""
    got = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    shapes = [f"{k}: checkpoint {tuple(got[k].shape)}, model {tuple(want[k])}"
              for k in sorted(set(want) & set(got)) if tuple(got[k].shape) != tuple(want[k])]
    if missing or extra or shapes:
        parts = []
        if missing:
            parts.append(f"missing tensors {missing[:5]}")
        if extra:
            parts.append(f"unexpected tensors {extra[:5]}")
        if shapes:
            parts.append("shape mismatch " + "; ".join(shapes[:5]))
        raise CheckpointError(f"{source} does not match the model: " + ", ".join(parts))
    for k, v in got.items():
        if v.dtype != torch.float32:  # saves write float32 whatever the training precision
            raise CheckpointError(f"{source}: tensor {k} is {v.dtype}; a checkpoint holds float32 weights")
        if not bool(torch.isfinite(v).all()):
            raise CheckpointError(f"{source}: tensor {k} holds NaN or inf; a checkpoint holds finite weights")
    return got


def load_model_state(model: torch.nn.Module, tensors: dict[str, torch.Tensor], *, source: str = "checkpoint"):
    """Copy the ``model.*`` tensors into ``model``, failing clearly (before copying anything) on any missing,
    extra, mis-shaped or non-finite tensor."""
    got = check_model_state({k: tuple(v.shape) for k, v in model_tensors(model).items()}, tensors, source=source)
    params = dict(model.state_dict(keep_vars=True))
    with torch.no_grad():
        for k, v in got.items():
            params[k].copy_(v.to(params[k].dtype))


def _finite_number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)


def optimizer_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module, record: dict[str, Any],
                    tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The optimizer state dict saved by :func:`save`, checked entry by entry against ``optimizer`` (parameter
    names, group settings, each state's keys, shapes and values). Raises :class:`CheckpointError`; touches no
    optimizer: pass the result to ``optimizer.load_state_dict``."""
    info = record.get("optimizer")
    if info is None:
        raise CheckpointError("this checkpoint holds no optimizer state (a weights-only checkpoint); "
                              "it can be sampled from but not resumed")
    bad = CheckpointError
    if not isinstance(info, dict) or not isinstance(info.get("param_groups"), list) or not isinstance(
            info.get("scalars"), dict):
        raise bad("the checkpoint's 'optimizer' entry must hold 'param_groups' (a list) and 'scalars' (an object)")
    order = _param_order(optimizer, model)
    current = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    if len(info["param_groups"]) != len(current) or not all(
            isinstance(g, dict) and isinstance(g.get("params"), list) for g in info["param_groups"]):
        raise bad("the checkpoint's optimizer parameter groups do not match this model's")
    saved = [n for g in info["param_groups"] for n in g["params"]]
    if saved != order:
        raise bad("the checkpoint's optimizer parameter groups do not match this model's")
    for g, now in zip(info["param_groups"], current, strict=True):
        keys = set(g) - {"params"}
        if keys != set(now):
            raise bad(f"the checkpoint's optimizer settings {sorted(keys)} differ from this optimizer's {sorted(now)}")
        for k, v in now.items():  # the run's config set these: the saved ones must be the same (lr follows the
            w = g[k]               # schedule: any finite lr >= 0, which the next step replaces)
            if k == "lr":
                ok = _finite_number(w) and w >= 0
            elif isinstance(v, tuple | list):
                ok = isinstance(w, list) and all(map(_finite_number, w)) and w == list(v)
            else:
                ok = type(w) is type(v) and w == v if isinstance(v, bool) else _finite_number(w) and w == v
            if not ok:
                raise bad(f"the checkpoint's optimizer setting {k!r} is {_short(w)}; this run's optimizer has "
                          f"{_short(v)} (from its training config)")
    params = dict(model.named_parameters())
    # our AdamW keeps exactly these per parameter; another optimizer's keys are only checked for consistency
    from transformer_lab.optim import AdamW
    known = {"step", "exp_avg", "exp_avg_sq"} if isinstance(optimizer, AdamW) else None
    step = record.get("step")
    state: dict[int, dict[str, Any]] = {}
    for i, pname in enumerate(order):
        st: dict[str, Any] = {}
        prefix = f"optimizer.{pname}."
        for k, v in tensors.items():
            if k.startswith(prefix):
                if tuple(v.shape) != tuple(params[pname].shape) or not v.is_floating_point() or bool(
                        torch.isnan(v).any()):
                    raise bad(f"the checkpoint's optimizer tensor {k} has shape {tuple(v.shape)} and dtype {v.dtype}"
                              f" or holds NaN; parameter {pname} has shape {tuple(params[pname].shape)}")
                st[k[len(prefix):]] = v
        scalars = info["scalars"].get(pname, {})
        if not isinstance(scalars, dict):
            raise bad(f"the checkpoint's optimizer scalars for {pname} must be an object")
        for k, s in scalars.items():
            if not isinstance(s, dict) or s.get("kind") not in ("tensor", "int", "float") or not _finite_number(
                    s.get("value")) or (s["kind"] == "int" and (s["value"] < 0 or s["value"] != int(s["value"]))):
                raise bad(f"the checkpoint's optimizer scalar {pname}.{k} must be {{'value': a finite number, "
                          f"'kind': 'tensor' | 'int' | 'float'}}, got {_short(s)}")
            if k in st:
                raise bad(f"the checkpoint's optimizer state {pname}.{k} is both a tensor and a scalar")
            st[k] = (torch.tensor(s["value"], dtype=torch.float32) if s["kind"] == "tensor"
                     else int(s["value"]) if s["kind"] == "int" else s["value"])
        if known is not None and st:
            if set(st) != known:
                raise bad(f"the checkpoint's optimizer state for {pname} holds {sorted(st)}; AdamW needs "
                          f"{sorted(known)}")
            t = st["step"]
            t = float(t) if isinstance(t, torch.Tensor) else t
            if t != int(t) or not 0 < t <= (step if _finite_number(step) else math.inf):
                raise bad(f"the checkpoint's optimizer step count for {pname} is {t}, the run's step is {step}")
        if st:
            state[i] = st
    if known is not None and state and len(state) != len(order):
        raise bad("the checkpoint's optimizer state covers some parameters but not others")
    if known is not None and _finite_number(step) and step > 0 and not state:
        raise bad(f"the checkpoint is at step {step} but holds no optimizer moments")
    groups, start = [], 0
    for g in info["param_groups"]:
        n = len(g["params"])
        groups.append({**g, "params": list(range(start, start + n))})
        start += n
    return {"state": state, "param_groups": groups}


def load_optimizer_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module, record: dict[str, Any],
                         tensors: dict[str, torch.Tensor]) -> None:
    """Restore the optimizer state saved by :func:`save` (parameters matched by name), checked first."""
    sd = optimizer_state(optimizer, model, record, tensors)
    try:
        optimizer.load_state_dict(sd)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"the checkpoint's optimizer state does not load: {exc}") from exc


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    except OverflowError:
        return False
    return True


class Lock:
    """``NAME.json.lock`` beside a checkpoint, created atomically (``O_CREAT | O_EXCL``) and holding the writer's pid:
    a second writer gets a :class:`CheckpointError` instead of interleaving its files with the first one's.

    A lock whose pid no longer runs (a killed trainer) is taken over; ``took_over`` then holds that pid, and the
    temporary files the dead writer left (``.NAME.*.tmp``) are removed. Use as a context manager."""

    def __init__(self, path: str | Path):
        self.checkpoint = json_path(path)
        self.path = self.checkpoint.with_name(self.checkpoint.name + ".lock")
        self.took_over: int | None = None
        self.held = False

    def _holder(self) -> int | None:
        """The pid in the lock file; None when it is empty or garbled (a writer between open and write, or junk)."""
        try:
            text = self.path.read_text(encoding="ascii", errors="replace").strip()
        except FileNotFoundError:
            return -1
        return int(text) if text.isdigit() else None

    def acquire(self) -> Lock:
        for _ in range(50):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                pid = self._holder()
                if pid == -1:  # removed meanwhile: try again
                    continue
                if pid is None:  # being written right now, or junk left by a crash
                    try:
                        age = time.time() - self.path.stat().st_mtime
                    except FileNotFoundError:
                        continue
                    if age < 2.0:
                        time.sleep(0.05)
                        continue
                elif pid == os.getpid() or _pid_alive(pid):
                    raise CheckpointError(
                        f"{self.checkpoint} is being written by another trainer (pid {pid}; lock file "
                        f"{self.path}); wait for it to finish, or pick another --out. If no trainer is running "
                        f"(pid {pid} is now another program), delete {self.path}") from None
                self.took_over = pid if pid is not None else 0
                self.path.unlink(missing_ok=True)
                continue
            try:
                os.write(fd, f"{os.getpid()}\n".encode("ascii"))
            finally:
                os.close(fd)
            self.held = True
            if self.took_over is not None:
                self._remove_temporaries()
            return self
        raise CheckpointError(f"could not take the lock {self.path}: it keeps changing hands")

    def _remove_temporaries(self) -> None:
        """The ``.NAME.json.*.tmp`` and ``.NAME.<hash>.safetensors.*.tmp`` files a killed writer left."""
        stem, own = self.checkpoint.stem, _own_weights(self.checkpoint)
        for tmp in self.checkpoint.parent.glob(f".{glob_escape(stem)}.*.tmp"):
            target = tmp.name[1:].rsplit(".", 2)[0]  # .TARGET.<random>.tmp -> TARGET
            if target == self.checkpoint.name or own.fullmatch(target):
                tmp.unlink(missing_ok=True)

    def release(self) -> None:
        if self.held and self._holder() == os.getpid():
            self.path.unlink(missing_ok=True)
        self.held = False

    def __enter__(self) -> Lock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
