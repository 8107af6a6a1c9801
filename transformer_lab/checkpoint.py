"""Checkpoints for the capstone (chapter 8): ``safetensors`` for tensors, JSON for everything else.

A checkpoint is addressed by its JSON file ``NAME.json``. The JSON holds the format tag, the model config, the
training step, the optimizer's hyper-parameters and scalar state, the RNG states, the corpus hash, the loss
history, and the name and sha256 of its tensor file ``NAME.<hash16>.safetensors`` (weights, optimizer moments).

Writing is atomic: the tensor file is written under a temporary name and renamed to its content-addressed name,
then the JSON is written the same way; an interrupted save leaves the previous checkpoint intact. Loading checks
the format tag, the file hash (a truncated or swapped file is caught), and every tensor's name and shape against
the model; nothing is ever unpickled (``safetensors`` stores raw arrays, JSON stores text).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

FORMAT = "transformer_lab.checkpoint"
VERSION = 1


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


def json_path(path: str | Path) -> Path:
    """``foo``, ``foo.json`` -> ``foo.json`` (a checkpoint is named by its JSON file)."""
    path = Path(path)
    return path if path.suffix == ".json" else path.with_name(path.name + ".json")


def encode_rng(state: torch.Tensor) -> str:
    """A generator state (uint8 tensor) as base64 text for the JSON."""
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def decode_rng(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with each shared (tied) tensor stored once, under its first name."""
    seen: dict[int, str] = {}
    out = {}
    for name, t in model.state_dict(keep_vars=False).items():
        key = t.data_ptr()
        if key in seen and t.numel():
            continue
        seen[key] = name
        out[name] = t.detach().contiguous().clone()
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
    jpath.parent.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v for k, v in model_tensors(model).items()}
    optim_json = None
    if optimizer is not None:
        sd = optimizer.state_dict()
        order = _param_order(optimizer, model)
        scalars: dict[str, dict[str, Any]] = {}
        for idx, st in sd["state"].items():
            pname = order[idx]
            for k, v in st.items():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    tensors[f"optimizer.{pname}.{k}"] = v.detach().contiguous().clone()
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
    new_file = not wpath.exists()  # the same weights saved again keep their name
    _atomic_write(wpath, lambda p: Path(p).write_bytes(data))
    record = {"format": FORMAT, "version": VERSION, "weights": wname, "weights_sha256": digest,
              "optimizer": optim_json, **meta}
    text = json.dumps(record, indent=1, sort_keys=False)
    try:
        _atomic_write(jpath, lambda p: Path(p).write_text(text, encoding="utf-8"))
    except BaseException:  # the previous JSON still names the previous weights: drop the new, unreferenced file
        if new_file:
            wpath.unlink(missing_ok=True)
        raise
    for old in jpath.parent.glob(f"{jpath.stem}.*.safetensors"):  # earlier saves, no longer referenced
        if old.name != wname:
            old.unlink(missing_ok=True)
    return jpath


def read(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Read and verify a checkpoint: returns (the JSON record, its tensors). Raises :class:`CheckpointError`."""
    jpath = json_path(path)
    if not jpath.is_file():
        raise CheckpointError(f"no checkpoint at {jpath}")
    try:
        record = json.loads(jpath.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{jpath} is not a transformer_lab checkpoint (not valid JSON: {exc}); "
                              "checkpoints are never unpickled") from exc
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise CheckpointError(f"{jpath} is not a transformer_lab checkpoint (its 'format' is not {FORMAT!r})")
    if record.get("version") != VERSION:
        raise CheckpointError(f"{jpath} has checkpoint version {record.get('version')!r}; this code reads {VERSION}")
    for key in ("weights", "weights_sha256", "config"):
        if key not in record:
            raise CheckpointError(f"{jpath} is incomplete: it has no {key!r} entry")
    wpath = jpath.parent / Path(record["weights"]).name
    if not wpath.is_file():
        raise CheckpointError(f"{jpath} names the weights file {wpath.name}, which is missing")
    digest = _file_sha256(wpath)
    if digest != record["weights_sha256"]:
        raise CheckpointError(f"{wpath} is truncated or corrupt: its sha256 is {digest[:16]}..., the checkpoint "
                              f"records {record['weights_sha256'][:16]}...")
    try:
        tensors = load_file(wpath)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{wpath} is not a readable safetensors file: {exc}") from exc
    return record, tensors


def load_model_state(model: torch.nn.Module, tensors: dict[str, torch.Tensor], *, source: str = "checkpoint"):
    """Copy the ``model.*`` tensors into ``model``, failing clearly on any missing, extra or mis-shaped tensor."""
    want = model_tensors(model)
    got = {k.removeprefix("model."): v for k, v in tensors.items() if k.startswith("model.")}
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    shapes = [f"{k}: checkpoint {tuple(got[k].shape)}, model {tuple(want[k].shape)}"
              for k in sorted(set(want) & set(got)) if got[k].shape != want[k].shape]
    if missing or extra or shapes:
        parts = []
        if missing:
            parts.append(f"missing tensors {missing[:5]}")
        if extra:
            parts.append(f"unexpected tensors {extra[:5]}")
        if shapes:
            parts.append("shape mismatch " + "; ".join(shapes[:5]))
        raise CheckpointError(f"{source} does not match the model: " + ", ".join(parts))
    params = dict(model.state_dict(keep_vars=True))
    with torch.no_grad():
        for k, v in got.items():
            params[k].copy_(v.to(params[k].dtype))


def load_optimizer_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module, record: dict[str, Any],
                         tensors: dict[str, torch.Tensor]) -> None:
    """Restore the optimizer state saved by :func:`save` (parameters matched by name)."""
    info = record.get("optimizer")
    if info is None:
        raise CheckpointError("this checkpoint holds no optimizer state (a weights-only checkpoint); "
                              "it can be sampled from but not resumed")
    order = _param_order(optimizer, model)
    saved = [n for g in info["param_groups"] for n in g["params"]]
    if saved != order:
        raise CheckpointError("the checkpoint's optimizer parameter groups do not match this model's")
    state: dict[int, dict[str, Any]] = {}
    for i, pname in enumerate(order):
        st: dict[str, Any] = {}
        prefix = f"optimizer.{pname}."
        for k, v in tensors.items():
            if k.startswith(prefix):
                st[k[len(prefix):]] = v
        for k, s in info["scalars"].get(pname, {}).items():
            kind = s["kind"]
            st[k] = (torch.tensor(s["value"], dtype=torch.float32) if kind == "tensor"
                     else int(s["value"]) if kind == "int" else s["value"])
        if st:
            state[i] = st
    groups, start = [], 0
    for g in info["param_groups"]:
        n = len(g["params"])
        groups.append({**g, "params": list(range(start, start + n))})
        start += n
    optimizer.load_state_dict({"state": state, "param_groups": groups})
