"""The book's plot style and its interactive figures (every chapter).

A figure is a plain function ``draw(**params) -> Figure``. :func:`interactive` turns it into one object that

* in a Jupyter kernel shows live ipywidgets controls that redraw on change, and
* on the built website, where no kernel runs, shows frames pre-rendered over one or two controls' values,
  switched by sliders in the page (a few lines of inline JavaScript, nothing loaded from anywhere).

Both travel in one mime bundle: the widget view for Jupyter and ``text/html`` for the site, which the book's
``nb_mime_priority_overrides`` prefers when it builds HTML.

Example::

    def draw(temperature=1.0, top_k=5):
        fig, ax = figure()
        ...
        return fig

    interactive(draw, temperature=Slider(0.1, 2.0, 0.1), top_k=Choice([1, 5, 10]))

A redraw should answer in under 100 ms of CPU, and most of it goes to matplotlib's artists: a tick (five
artists) or a bar (one) costs about a millisecond. Set few ticks where they carry little, and use :func:`bars`
for ``ax.bar``/``ax.barh`` and :func:`category_labels` for named categories along an axis.
"""

from __future__ import annotations

import base64
import contextlib
import html
import inspect
import io
import itertools
import json
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import offset_copy
from PIL import Image

from transformer_lab.page import bilingual

# ---------------------------------------------------------------- style
PALETTE = ["#1f5fa8", "#d1495b", "#2e933c", "#edae49", "#6a4c93", "#00798c", "#8d6a9f", "#595959"]
"""Colours used across the book: blue, red, green, amber, purple, teal, mauve, grey."""

STYLE = {
    "figure.figsize": (6.4, 3.6),
    "figure.dpi": 100,
    "figure.constrained_layout.use": True,
    "font.size": 10,
    "text.hinting": "no_hinting",  # unhinted glyphs: about 0.5 ms less per text on every redraw
    "axes.titlesize": 11,
    "axes.titley": 1.0,  # a fixed title position: matplotlib's automatic one lays the x axis out twice per redraw
    "axes.labelsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.prop_cycle": matplotlib.cycler(color=PALETTE),
    "image.cmap": "viridis",
    "legend.frameon": False,
    "savefig.dpi": 80,
}
"""Matplotlib settings shared by every figure in the book."""

FRAME_DPI = 80
"""Resolution of pre-rendered frames: a 6.4 x 3.6 in figure becomes 512 x 288 px."""


def use_style() -> None:
    """Apply the book's plot style (idempotent)."""
    matplotlib.rcParams.update(STYLE)


def figure(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float] | None = None, **kwargs):
    """A new Figure in the book's style, made without pyplot (nothing leaks into a notebook's output).

    Returns ``(fig, ax)``, with ``ax`` an array of Axes when ``nrows * ncols > 1``.
    """
    use_style()
    fig = Figure(figsize=figsize or STYLE["figure.figsize"])
    axes = fig.subplots(nrows, ncols, squeeze=True, **kwargs)
    return fig, axes


def bars(ax, x, height, width: float = 0.8, *, bottom=0.0, horizontal: bool = False, **kwargs) -> PolyCollection:
    """The rectangles ``ax.bar(x, height, width, bottom)`` draws (``ax.barh`` with ``horizontal=True``), as one
    PolyCollection: ``ax.bar`` builds one artist per bar, about 0.7 ms each on a redraw, one collection a fraction
    of that. ``kwargs`` go to the collection (``color``, ``alpha``, ``label`` for a legend entry ...).
    """
    x, height, bottom = np.broadcast_arrays(np.asarray(x, float), np.asarray(height, float), np.asarray(bottom, float))
    lo, hi, top = x - width / 2, x + width / 2, bottom + height
    corners = [(lo, bottom), (lo, top), (hi, top), (hi, bottom)]
    verts = np.stack([np.stack(c, axis=-1) for c in corners], axis=1)  # (n, 4, 2)
    kwargs.setdefault("linewidth", 0)
    rects = PolyCollection(verts[..., ::-1] if horizontal else verts, **kwargs)
    (rects.sticky_edges.x if horizontal else rects.sticky_edges.y).extend(np.unique(bottom))  # no margin at the base
    ax.add_collection(rects)
    ax.autoscale_view()
    return rects


def category_labels(ax, positions, labels, *, axis: str = "x", rotation: float = 0, **kwargs) -> None:
    """Name the categories at ``positions`` along ``axis`` ("x" or "y") with plain text under (left of) the axes,
    in place of ``ax.set_xticks(positions, labels)``, which builds a Tick of five artists per label: a third of
    the cost on a redraw. The axis is left without ticks. ``kwargs`` go to each Text (``fontsize``, ...).
    """
    if axis == "x":
        ax.set_xticks([])
        where = offset_copy(ax.get_xaxis_transform(), ax.figure, y=-4, units="points")
        kwargs = {"ha": "right" if rotation else "center", "va": "top", **kwargs}
    else:
        ax.set_yticks([])
        where = offset_copy(ax.get_yaxis_transform(), ax.figure, x=-4, units="points")
        kwargs = {"ha": "right", "va": "center", **kwargs}
    for p, label in zip(positions, labels, strict=True):
        xy = (p, 0) if axis == "x" else (0, p)
        ax.text(*xy, label, transform=where, rotation=rotation, rotation_mode="anchor", clip_on=False, **kwargs)


_RENDERERS: dict[tuple, RendererAgg] = {}


class _SharedRendererCanvas(FigureCanvasAgg):
    """An Agg canvas that draws with one renderer per image size, shared by every figure: matplotlib caches text
    metrics per renderer, so a redraw (a new figure each time) finds its labels already measured."""

    def get_renderer(self):
        w, h = self.get_width_height(physical=True)
        key = (w, h, self.figure.dpi)
        if key not in _RENDERERS:
            _RENDERERS[key] = RendererAgg(w, h, self.figure.dpi)
        return _RENDERERS[key]


MIN_TEXT_PX = 9
"""The smallest text a figure draws, in pixels of its PNG. On a phone the site shows a figure at its natural size
(book.css), scrolling sideways where the screen is narrower, so no label is drawn smaller than this."""


def legible(fig: Figure, dpi: int = FRAME_DPI) -> Figure:
    """Raise every text of ``fig`` smaller than :data:`MIN_TEXT_PX` pixels at ``dpi`` to that size."""
    floor = MIN_TEXT_PX * 72 / dpi  # points
    for text in fig.findobj(Text):
        if text.get_fontsize() < floor:
            text.set_fontsize(floor)
    return fig


def to_png(fig: Figure, *, dpi: int = FRAME_DPI, colors: int = 128) -> bytes:
    """Render ``fig`` to a small PNG: a palette image of at most ``colors`` colours, no text smaller than
    :data:`MIN_TEXT_PX` pixels (:func:`legible`).

    Draws straight into an Agg buffer and quantises it (fast octree), which costs about half of
    ``savefig`` followed by a re-encode: most of a redraw's time is here.
    """
    legible(fig, dpi)
    fig.set_dpi(dpi)
    canvas = _SharedRendererCanvas(fig)
    canvas.draw()
    image = Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3])
    image = image.quantize(colors=colors, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    out = io.BytesIO()
    image.save(out, format="PNG", compress_level=6)
    return out.getvalue()


@contextlib.contextmanager
def _one_torch_thread():
    """Run torch on one intra-op thread, if torch is in use. A figure computes on small arrays, where a parallel
    op gains nothing and costs the wait for a second thread: on a busy 2-core machine, milliseconds of CPU per
    op (measured 4-8 ms for ``exp`` of a 3,000-vector, against 0.01 ms on one thread)."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------- controls
@dataclass(frozen=True)
class Slider:
    """A numeric control taking the values ``lo, lo + step, ..., hi``; starts at ``value`` (default ``lo``)."""

    lo: float
    hi: float
    step: float
    value: float | None = None

    def __post_init__(self):
        if not self.step > 0:
            raise ValueError(f"Slider step must be > 0, got {self.step}")
        if not self.hi > self.lo:
            raise ValueError(f"Slider range is empty: lo={self.lo} must be < hi={self.hi}")
        if self.value is not None and not self.lo <= self.value <= self.hi:
            raise ValueError(f"Slider value {self.value} lies outside [{self.lo}, {self.hi}]")

    @property
    def is_int(self) -> bool:
        return all(float(v).is_integer() for v in (self.lo, self.hi, self.step))

    def values(self) -> list:
        n = int(np.floor((self.hi - self.lo) / self.step + 1e-9)) + 1
        vals = [self.lo + i * self.step for i in range(n)]
        return [round(v) for v in vals] if self.is_int else [round(v, 10) for v in vals]

    def default(self):
        v = self.lo if self.value is None else self.value
        return int(v) if self.is_int else v


class _FirstOption:
    """The default of :class:`Choice.value`: start at the first option (``None`` may be an option's value)."""

    def __repr__(self) -> str:
        return "FIRST_OPTION"


FIRST_OPTION = _FirstOption()


@dataclass(frozen=True)
class Choice:
    """A control with a fixed list of options: values, or ``(label, value)`` pairs; ``value`` is the default
    (the first option unless given; ``None`` is an ordinary value, e.g. ``("off", None)``)."""

    options: Sequence[Any]
    value: Any = FIRST_OPTION
    pairs: tuple = field(init=False, repr=False)

    def __post_init__(self):
        pairs = tuple(o if isinstance(o, tuple) and len(o) == 2 else (str(o), o) for o in self.options)
        if not pairs:
            raise ValueError("Choice needs at least one option, got an empty list")
        if self.value is not FIRST_OPTION and self.value not in [v for _, v in pairs]:
            raise ValueError(f"Choice value {self.value!r} is not one of its options {[v for _, v in pairs]}")
        object.__setattr__(self, "pairs", pairs)

    def values(self) -> list:
        return [v for _, v in self.pairs]

    def labels(self) -> list[str]:
        return [label for label, _ in self.pairs]

    def default(self):
        return self.pairs[0][1] if self.value is FIRST_OPTION else self.value


def _label(control: Slider | Choice, value) -> str:
    if isinstance(control, Choice):
        return control.labels()[control.values().index(value)]
    return f"{value:g}" if isinstance(value, float) else str(value)


# ---------------------------------------------------------------- the figure object
class InteractiveFigure:
    """A drawing function with controls; see :func:`interactive`."""

    def __init__(self, draw: Callable[..., Figure], controls: dict, fixed: dict, static: tuple[str, ...],
                 max_frames: int, alt: str):
        self.draw, self.controls, self.fixed, self.static = draw, controls, fixed, static
        self.max_frames, self.alt = max_frames, alt
        self._widget = None
        self._layout = None  # axes positions from the first render

    # -- shared
    def defaults(self) -> dict:
        """The parameters the figure starts with."""
        return {**self.fixed, **{name: c.default() for name, c in self.controls.items()}}

    def render(self, **params) -> bytes:
        """Draw with ``params`` over the defaults and return the PNG bytes (the figure is discarded).

        The first render lays the figure out (constrained layout, about half of a redraw's cost); later ones
        with the same number of axes reuse those axes positions, so moving a control only redraws.
        """
        with _one_torch_thread():
            fig = self.draw(**{**self.defaults(), **params})
        if not isinstance(fig, Figure):
            raise TypeError(f"{self.draw.__name__} must return a matplotlib Figure, got {type(fig).__name__}")
        axes = fig.get_axes()
        if self._layout is not None and len(self._layout) == len(axes):
            fig.set_layout_engine("none")
            for ax, position in zip(axes, self._layout, strict=True):
                ax.set_position(position)
        png = to_png(fig)
        if self._layout is None:
            self._layout = [ax.get_position(original=True) for ax in axes]
        return png

    def time_redraw(self, repeats: int = 10, **params) -> float:
        """Seconds of CPU for one redraw (draw + render), the cost a moved control pays: the best of
        ``repeats``, in CPU time of the calling thread (a redraw runs in it alone: torch on one thread), so that
        other processes on a busy machine and the kernel's own threads (messaging, idle OpenMP workers spinning
        after earlier work) do not inflate it."""
        times = []
        for _ in range(repeats):
            t0 = time.thread_time()
            self.render(**params)
            times.append(time.thread_time() - t0)
        return min(times)

    # -- the website: pre-rendered frames
    def frame_keys(self) -> list[tuple[int, ...]]:
        return list(itertools.product(*(range(len(self.controls[n].values())) for n in self.static)))

    def static_html(self) -> str:
        """Self-contained HTML: one ``<img>`` per frame and a page control per static parameter."""
        uid = "tlfig-" + uuid.uuid4().hex[:8]
        start = tuple(self.controls[n].values().index(self.controls[n].default()) for n in self.static)
        imgs = []
        for key in self.frame_keys():
            params = {n: self.controls[n].values()[i] for n, i in zip(self.static, key, strict=True)}
            data = base64.b64encode(self.render(**params)).decode("ascii")
            desc = ", ".join(f"{n} = {_label(self.controls[n], v)}" for n, v in params.items())
            hidden = "" if key == start else " hidden"
            imgs.append(f'<img src="data:image/png;base64,{data}" data-key="{"_".join(map(str, key))}" '
                        f'alt="{html.escape(self.alt + " (" + desc + ")")}"{hidden}>')
        inputs = []
        for n, i0 in zip(self.static, start, strict=True):
            c = self.controls[n]
            labels = [_label(c, v) for v in c.values()]
            if isinstance(c, Choice):  # a choice among names: a menu, as in Jupyter
                options = "".join(f'<option value="{i}"{" selected" if i == i0 else ""}>{html.escape(label)}'
                                  f"</option>" for i, label in enumerate(labels))
                inputs.append(f'<label class="tl-fig-control">{html.escape(n)} <select aria-label="'
                              f'{html.escape(n)}" oninput="tlFig(this)">{options}</select></label>')
                continue
            inputs.append(
                f'<label class="tl-fig-control">{html.escape(n)} '
                f'<input type="range" min="0" max="{len(labels) - 1}" step="1" value="{i0}" '
                f"data-labels='{html.escape(json.dumps(labels))}' aria-label=\"{html.escape(n)}\" "
                f'oninput="tlFig(this)"> <output>{html.escape(labels[i0])}</output></label>')
        others = ", ".join(f"{n} = {_label(c, c.default())}" for n, c in self.controls.items()
                           if n not in self.static)
        note = bilingual(*(html.escape(first + (fixed.format(others) if others else "") + last)
                           for first, fixed, last in _NOTE.values()))
        return (f'<div class="tl-fig" id="{uid}">{_SCRIPT}'
                f'<div class="tl-fig-controls">{"".join(inputs)}</div>'
                f'<div class="tl-fig-frames">{"".join(imgs)}</div>'
                f'<p class="tl-fig-note">{note}</p></div>')

    # -- Jupyter: live widgets
    def widget(self):
        """The ipywidgets panel: one control per parameter above an output that redraws on change."""
        if self._widget is None:
            import ipywidgets as w

            def make(name, c):
                style = {"description_width": "initial"}
                if isinstance(c, Choice):
                    # by index: ipywidgets reads value=None as "select nothing", a blank box
                    return w.Dropdown(options=list(c.pairs), index=c.values().index(c.default()),
                                      description=name, style=style)
                cls = w.IntSlider if c.is_int else w.FloatSlider
                return cls(min=c.lo, max=c.hi, step=c.step, value=c.default(), description=name,
                           continuous_update=True, style=style)

            boxes = {name: make(name, c) for name, c in self.controls.items()}
            out = w.Output()

            def redraw(_=None):  # replace the Output's single frame (works with or without a kernel)
                png = self.render(**{n: b.value for n, b in boxes.items()})
                data = {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": self.alt}
                out.outputs = ({"output_type": "display_data", "data": data, "metadata": {}},)

            for b in boxes.values():
                b.observe(redraw, names="value")
            redraw()
            self._widget = w.VBox([w.HBox(list(boxes.values()), layout=w.Layout(flex_flow="row wrap")), out])
        return self._widget

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = dict(self.widget()._repr_mimebundle_(include=include, exclude=exclude) or {})
        bundle["text/html"] = self.static_html()
        bundle["text/plain"] = f"<interactive figure: {self.alt}>"
        return bundle


_NOTE = {"en": ("Pre-rendered frames: each setting of the controls has its picture", "; fixed here at {}",
                ". Run the notebook for every control live."),
         "zh": ("预先渲染的画面：控件的每个取值各有一幅图", "；此处固定为 {}", "。运行笔记本可实时调节每个控件。")}
"""The note under a figure on the website, in English and in Chinese (:func:`~transformer_lab.exercises.bilingual`)."""

_SCRIPT = (
    "<script>window.tlFig=window.tlFig||function(el){"
    "var f=el.closest('.tl-fig'),ins=f.querySelectorAll('.tl-fig-controls input, .tl-fig-controls select');"
    "var k=Array.prototype.map.call(ins,function(i){return i.value}).join('_');"
    "f.querySelectorAll('.tl-fig-frames img').forEach(function(m){m.hidden=(m.dataset.key!==k)});"
    "var o=el.parentNode.querySelector('output');if(o)o.textContent=JSON.parse(el.dataset.labels)[+el.value];};"
    "</script>"
)


def interactive(draw: Callable[..., Figure], *, static: str | Sequence[str] | None = None,
                max_frames: int = 48, alt: str | None = None, **params) -> InteractiveFigure:
    """Make ``draw`` interactive: live controls in Jupyter, pre-rendered frames on the website.

    ``params`` name parameters of ``draw``: a :class:`Slider` or :class:`Choice` becomes a control, anything
    else is passed as is. ``static`` names the one or two controls whose values are pre-rendered for the site
    (default: the first control); the others stay at their defaults there. At most ``max_frames`` frames.
    """
    sig = inspect.signature(draw)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    for name in params:
        if not takes_any and name not in sig.parameters:
            raise ValueError(f"{draw.__name__}() has no parameter {name!r}; it takes {list(sig.parameters)}")
    controls = {n: v for n, v in params.items() if isinstance(v, Slider | Choice)}
    fixed = {n: v for n, v in params.items() if n not in controls}
    if not controls:
        raise ValueError("interactive() needs at least one Slider or Choice control")
    static = (next(iter(controls)),) if static is None else ((static,) if isinstance(static, str) else tuple(static))
    if not 1 <= len(static) <= 2:
        raise ValueError(f"static takes one or two control names, got {len(static)}")
    for name in static:
        if name not in controls:
            raise ValueError(f"static control {name!r} is not one of the controls {list(controls)}")
    n_frames = int(np.prod([len(controls[n].values()) for n in static]))
    if n_frames > max_frames:
        raise ValueError(f"{n_frames} frames for {static} exceeds max_frames={max_frames}; use a coarser step")
    return InteractiveFigure(draw, controls, fixed, static, max_frames, alt or (draw.__doc__ or draw.__name__)
                             .strip().splitlines()[0])


REDRAW_TARGET_S = 0.1  # a moved control should answer within about 100 ms


def redraw_times(namespace: dict[str, Any], repeats: int = 10) -> dict[str, float]:
    """CPU seconds of one redraw (:meth:`InteractiveFigure.time_redraw`) of every interactive figure a page kept:
    the values of ``namespace`` (a kernel's globals) and of its ``Out`` (what the page displayed), by the name of
    each figure's draw function."""
    held = [*namespace.get("Out", {}).values(), *namespace.values()]
    figures = {id(v): v for v in held if isinstance(v, InteractiveFigure)}
    return {f.draw.__name__: round(f.time_redraw(repeats), 4) for f in figures.values()}
