"""A worker's GPUs (`work --gpus`): found through NVML, limited to the
worker's own CUDA_VISIBLE_DEVICES, and selected by the flag.

NVML is read through NVIDIA's `nvidia-ml-py` (module `pynvml`, the optional
`gpu` extra), imported only by `nvml_devices`, so a worker started without
`--gpus` never loads it. Each device is known by its UUID, its NVML index (the
order of the PCI bus, as `nvidia-smi` numbers them), its model name and its
memory. SPOOLCTL_TEST_GPUS, a test knob, replaces what NVML finds with a
declared list (a machine without GPUs posing as one with them); the rest of
the path is the same.

`--gpus` is absent (the worker manages no GPU: its jobs' environment is left
as it is), `all` (every GPU found), `none`, or NVML indexes and UUIDs
(`0,1`, `GPU-8f3c…`, a unique prefix of one), each of which must be found.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from spoolctl.errors import ExtraMissing, InvalidInput
from spoolctl.resources import Device
from spoolctl.text import size_text
from spoolctl.validate import memory_size

TEST_GPUS_ENV = "SPOOLCTL_TEST_GPUS"
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
SPEC_MAX = 4096
"""The longest `--gpus` value read."""
MAX_DEVICES = 1024
"""At most this many devices on one worker (the knob's and the flag's bound)."""
SPEC_GRAMMAR = "all, none, or NVML indexes and GPU UUIDs, comma-separated (0,1 or GPU-8f3c…)"
DEVICE_KEYS = ("uuid", "index", "model", "memory")
NAME_RE = re.compile(r"[0-9]+|[A-Za-z][A-Za-z0-9-]*")
"""How `--gpus` names a device: its NVML index, or its UUID (GPU-8f3c…) or a prefix of it."""


class Spec(NamedTuple):
    """What `--gpus` asks for: every device found, or those named (none: ())."""

    every: bool
    names: tuple[str, ...] = ()


NONE = Spec(False)


def read_spec(raw: str) -> Spec:
    """`--gpus` as written, checked before any GPU is looked at: INVALID_INPUT
    names the flag."""
    text = raw.strip()
    if len(raw) > SPEC_MAX:
        raise _bad(f"at most {SPEC_MAX} characters", raw)
    if text.lower() == "all":
        return Spec(True)
    if text.lower() == "none":
        return NONE
    names = tuple(part.strip() for part in text.split(","))
    if not text or any(not name for name in names):
        raise _bad(f"must be {SPEC_GRAMMAR}; got {raw!r}", raw)
    if len(names) > MAX_DEVICES:
        raise _bad(f"at most {MAX_DEVICES} devices", raw)
    for name in names:
        if not NAME_RE.fullmatch(name):
            raise _bad(
                f"a device is named by its NVML index (0, 1 …) or its UUID, not {name!r}", raw
            )
    return Spec(False, names)


def _bad(message: str, raw: str) -> InvalidInput:
    return InvalidInput(message, flag="--gpus", value=raw)


def find(spec: Spec | None, environ: Mapping[str, str] | None = None) -> tuple[Device, ...]:
    """The devices a worker places jobs on (None, no `--gpus`: none, and
    nothing is looked at), in NVML index order."""
    if spec is None or spec == NONE:
        return ()
    env = os.environ if environ is None else environ
    declared = env.get(TEST_GPUS_ENV)
    found = nvml_devices() if declared is None else declared_devices(declared)
    shown = visible(found, env.get(VISIBLE_ENV))
    if spec.every:
        return shown
    return select(shown, spec.names, hidden=len(shown) < len(found))


def select(
    devices: tuple[Device, ...], names: Iterable[str], *, hidden: bool
) -> tuple[Device, ...]:
    """The devices `names` name (an NVML index, a UUID or a unique prefix of
    one), each once; INVALID_INPUT names `--gpus` and what there is."""
    chosen: dict[str, Device] = {}
    for name in names:
        device = _named(devices, name)
        if device is None:
            raise InvalidInput(
                f"--gpus names {name!r}, which is not {_what_there_is(devices, hidden)}",
                flag="--gpus",
                value=name,
                devices=[d.as_dict() for d in devices],
            )
        if device.uuid in chosen:
            raise InvalidInput(
                f"--gpus names GPU {device.index} ({device.uuid}) twice", flag="--gpus", value=name
            )
        chosen[device.uuid] = device
    return tuple(sorted(chosen.values(), key=lambda d: d.index))


def _named(devices: tuple[Device, ...], name: str) -> Device | None:
    if name.isdigit():
        return next((d for d in devices if d.index == int(name)), None)
    exact = [d for d in devices if d.uuid.lower() == name.lower()]
    prefixed = [d for d in devices if d.uuid.lower().startswith(name.lower())]
    found = exact or prefixed
    return found[0] if len(found) == 1 else None


def _what_there_is(devices: tuple[Device, ...], hidden: bool) -> str:
    listed = "; ".join(f"{d.index}: {d.uuid} ({d.model})" for d in devices)
    where = f"one of this worker's GPUs ({listed})" if devices else "a GPU: this worker finds none"
    if hidden:
        where += f" ({VISIBLE_ENV} hides the others)"
    return where


def visible(devices: tuple[Device, ...], raw: str | None) -> tuple[Device, ...]:
    """The devices the worker's own CUDA_VISIBLE_DEVICES lets it use (unset:
    all). As CUDA reads it: entries are indexes (NVML's order, as
    CUDA_DEVICE_ORDER=PCI_BUS_ID numbers them) or UUIDs (or a unique prefix),
    the first entry that names no device ends the list, and an empty value
    hides every device."""
    if raw is None:
        return devices
    kept: dict[str, Device] = {}
    for entry in raw.split(","):
        device = _named(devices, entry.strip()) if entry.strip() else None
        if device is None:
            break
        kept.setdefault(device.uuid, device)
    return tuple(sorted(kept.values(), key=lambda d: d.index))


def nvml_devices() -> tuple[Device, ...]:
    """Every GPU NVML finds on this machine: EXTRA_MISSING without
    nvidia-ml-py, INVALID_INPUT naming `--gpus` where NVML cannot be used (no
    driver, no permission)."""
    try:
        import pynvml
    except ImportError as exc:
        raise ExtraMissing(
            "work --gpus needs the gpu extra to find GPUs through NVML "
            f"({exc.name or 'pynvml'} is missing)",
            extra="gpu",
            missing=exc.name or "pynvml",
        ) from None
    failure = getattr(pynvml, "NVMLError", OSError)
    try:
        pynvml.nvmlInit()
    except (failure, OSError) as exc:
        raise _unusable(exc) from None
    try:
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            devices.append(
                Device(
                    _text(pynvml.nvmlDeviceGetUUID(handle)),
                    index,
                    _text(pynvml.nvmlDeviceGetName(handle)),
                    int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                )
            )
    except (failure, OSError) as exc:
        raise _unusable(exc) from None
    finally:
        with contextlib.suppress(failure, OSError):  # what was read stands
            pynvml.nvmlShutdown()
    return tuple(devices)


def _unusable(exc: BaseException) -> InvalidInput:
    return InvalidInput(
        f"--gpus: NVML cannot be used on this machine ({exc}): a working NVIDIA driver is "
        "needed to find GPUs; run the worker without --gpus, or with --gpus none",
        flag="--gpus",
        reason=str(exc),
    )


def _text(value: bytes | str) -> str:
    """NVML's strings: bytes from older bindings, str from newer ones."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def declared_devices(raw: str) -> tuple[Device, ...]:
    """SPOOLCTL_TEST_GPUS: a JSON list of {"uuid", "index", "model", "memory"}
    (memory in bytes or a size like 80G; model and memory may be left out).
    A malformed value is INVALID_INPUT naming the knob."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise _bad_knob(f"is not JSON ({exc})") from None
    if not isinstance(data, list) or len(data) > MAX_DEVICES:
        raise _bad_knob(f"must be a JSON list of at most {MAX_DEVICES} devices")
    devices = tuple(_declared(entry, n) for n, entry in enumerate(data))
    if len({d.uuid for d in devices}) < len(devices):
        raise _bad_knob("declares two devices with the same uuid")
    if len({d.index for d in devices}) < len(devices):
        raise _bad_knob("declares two devices with the same index")
    return tuple(sorted(devices, key=lambda d: d.index))


def _declared(entry: Any, n: int) -> Device:
    if not isinstance(entry, dict) or set(entry) - set(DEVICE_KEYS):
        raise _bad_knob(f"entry {n} must be an object with keys {', '.join(DEVICE_KEYS)}")
    uuid, index = entry.get("uuid"), entry.get("index")
    if not isinstance(uuid, str) or not uuid.strip() or "," in uuid or not uuid.isprintable():
        raise _bad_knob(f"entry {n} needs a uuid: a text without commas")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < MAX_DEVICES:
        raise _bad_knob(f"entry {n} needs an index from 0 to {MAX_DEVICES - 1}")
    model = entry.get("model", "unknown")
    if not isinstance(model, str) or not model.strip():
        raise _bad_knob(f"entry {n}'s model must be a text")
    return Device(uuid.strip(), index, model, _declared_memory(entry.get("memory"), n))


def _declared_memory(memory: Any, n: int) -> int | None:
    if memory is None:
        return None
    if isinstance(memory, int) and not isinstance(memory, bool) and memory > 0:
        return memory
    if isinstance(memory, str):
        try:
            return memory_size(memory)
        except InvalidInput:
            pass
    raise _bad_knob(f"entry {n}'s memory must be bytes or a size like 80G, got {memory!r}")


def _bad_knob(why: str) -> InvalidInput:
    return InvalidInput(f"{TEST_GPUS_ENV} {why}", name=TEST_GPUS_ENV)


def summary(
    devices: tuple[Device, ...], memory_bytes: int | None, *, looked: bool = False
) -> str | None:
    """What a worker says of its GPUs (`looked`: --gpus was given) and its
    memory budget as it starts (None: it was given neither)."""
    parts = []
    if devices:
        listed = ", ".join(f"{d.index} {d.uuid}" for d in devices)
        parts.append(f"{len(devices)} GPU{'' if len(devices) == 1 else 's'} ({listed})")
    elif looked:
        parts.append("no GPU (--gpus found none)")
    if memory_bytes is not None:
        parts.append(f"a memory budget of {size_text(memory_bytes)}")
    return "places jobs on " + " and ".join(parts) if parts else None


def discovery() -> dict[str, Any]:
    """Whether `work --gpus` can find GPUs here, for `capabilities` (the
    library is looked for, not loaded; the driver is looked at by a worker)."""
    installed = importlib.util.find_spec("pynvml") is not None
    return {
        "available": installed,
        "library": "nvidia-ml-py",
        "module": "pynvml",
        "extra": "gpu",
        "flag": "work --gpus all|none|INDEXES,UUIDS",
        "limited_by": VISIBLE_ENV,
        "test_knob": TEST_GPUS_ENV,
    }
