"""A worker's GPUs (spoolctl/runner/gpus.py): `work --gpus` read, the test
knob's declared inventory, the worker's own CUDA_VISIBLE_DEVICES, the
errors, and the NVML path through a fake `pynvml` that records its calls."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from spoolctl.errors import ExtraMissing, InvalidInput
from spoolctl.resources import Device
from spoolctl.runner import gpus
from spoolctl.runner.gpus import NONE, Spec, find, read_spec, visible

A = {"uuid": "GPU-aaaa-1111", "index": 0, "model": "NVIDIA A100-SXM4-80GB", "memory": "80G"}
B = {"uuid": "GPU-bbbb-2222", "index": 1, "model": "NVIDIA A100-SXM4-80GB", "memory": 85899345920}
C = {"uuid": "GPU-cccc-3333", "index": 2, "model": "NVIDIA L4"}
KNOB = json.dumps([C, A, B])
DEV_A = Device("GPU-aaaa-1111", 0, "NVIDIA A100-SXM4-80GB", 80 << 30)
DEV_B = Device("GPU-bbbb-2222", 1, "NVIDIA A100-SXM4-80GB", 80 << 30)
DEV_C = Device("GPU-cccc-3333", 2, "NVIDIA L4", None)
ALL = (DEV_A, DEV_B, DEV_C)


def knob(value: str = KNOB, **more: str) -> dict[str, str]:
    return {gpus.TEST_GPUS_ENV: value, **more}


@pytest.mark.parametrize(
    ("raw", "spec"),
    [
        ("all", Spec(True)),
        (" ALL ", Spec(True)),
        ("none", NONE),
        ("None", NONE),
        ("0", Spec(False, ("0",))),
        ("0, 1", Spec(False, ("0", "1"))),
        ("GPU-aaaa,2", Spec(False, ("GPU-aaaa", "2"))),
    ],
)
def test_the_spec_reads_all_none_and_names(raw: str, spec: Spec) -> None:
    assert read_spec(raw) == spec


@pytest.mark.parametrize(
    "raw", ["", " ", ",", "0,", "0,,1", "-1", "0.5", "1/2", "é", "0\x00", "GPU 0", "x" * 5000]
)
def test_a_malformed_spec_is_invalid_input_naming_the_flag(raw: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        read_spec(raw)
    assert caught.value.detail["flag"] == "--gpus"


def test_no_spec_and_none_look_at_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # importing it would fail
    assert find(None, {}) == ()
    assert find(NONE, {}) == ()
    assert find(None, knob("not json")) == (), "the knob is read only when GPUs are asked for"


def test_the_knob_replaces_nvml_and_all_takes_every_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert find(Spec(True), knob()) == ALL, "in NVML index order, memory read as sizes or bytes"
    assert find(read_spec("2,0"), knob()) == (DEV_A, DEV_C)
    assert find(read_spec("GPU-bbbb-2222"), knob()) == (DEV_B,), "by UUID"
    assert find(read_spec("gpu-cc"), knob()) == (DEV_C,), "by a unique prefix, any case"
    assert find(Spec(True), knob("[]")) == ()


@pytest.mark.parametrize(
    ("names", "why"),
    [
        ("3", "'3', which is not one of this worker's GPUs"),
        ("GPU-", "'GPU-', which is not"),  # a prefix of all three: ambiguous
        ("GPU-dddd", "'GPU-dddd', which is not"),
        ("0,GPU-aaaa", "GPU 0 (GPU-aaaa-1111) twice"),
    ],
)
def test_a_device_not_found_or_named_twice_is_invalid_input(names: str, why: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        find(read_spec(names), knob())
    assert why in caught.value.message
    assert caught.value.detail["flag"] == "--gpus"
    if "not" in why:
        assert "GPU-cccc-3333 (NVIDIA L4)" in caught.value.message, "what there is"
        assert len(caught.value.detail["devices"]) == 3


@pytest.mark.parametrize(
    ("visible_devices", "found"),
    [
        ("0,2", (DEV_A, DEV_C)),
        ("2,0", (DEV_A, DEV_C)),
        ("1", (DEV_B,)),
        ("GPU-cccc-3333", (DEV_C,)),
        ("GPU-bbbb,0", (DEV_A, DEV_B)),
        ("", ()),
        (" ", ()),
        ("0,7,1", (DEV_A,)),  # as CUDA reads it: the first that names no device ends it
        ("-1,0", ()),
        ("MIG-1234", ()),
        ("0,0", (DEV_A,)),
    ],
)
def test_the_workers_cuda_visible_devices_limits_what_it_finds(
    visible_devices: str, found: tuple[Device, ...]
) -> None:
    env = knob(CUDA_VISIBLE_DEVICES=visible_devices)
    assert find(Spec(True), env) == found
    assert visible(ALL, visible_devices) == found
    assert visible(ALL, None) == ALL


def test_a_device_hidden_by_cuda_visible_devices_cannot_be_named() -> None:
    with pytest.raises(InvalidInput) as caught:
        find(read_spec("1"), knob(CUDA_VISIBLE_DEVICES="0"))
    assert "CUDA_VISIBLE_DEVICES hides the others" in caught.value.message
    assert find(read_spec("0"), knob(CUDA_VISIBLE_DEVICES="0")) == (DEV_A,)
    with pytest.raises(InvalidInput, match="finds none"):
        find(read_spec("0"), knob(CUDA_VISIBLE_DEVICES=""))


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("not json", "is not JSON"),
        ('{"uuid": "GPU-a"}', "JSON list"),
        ("[1]", "entry 0 must be an object"),
        ('[{"uuid": "GPU-a", "index": 0, "memroy": "8G"}]', "keys uuid, index, model, memory"),
        ('[{"index": 0}]', "entry 0 needs a uuid"),
        ('[{"uuid": "GPU-a,GPU-b", "index": 0}]', "needs a uuid"),
        ('[{"uuid": "GPU-a"}]', "entry 0 needs an index"),
        ('[{"uuid": "GPU-a", "index": -1}]', "needs an index"),
        ('[{"uuid": "GPU-a", "index": true}]', "needs an index"),
        ('[{"uuid": "GPU-a", "index": 0, "model": 7}]', "model must be a text"),
        ('[{"uuid": "GPU-a", "index": 0, "memory": "lots"}]', "memory must be bytes or a size"),
        ('[{"uuid": "GPU-a", "index": 0, "memory": -5}]', "memory must be bytes or a size"),
        ('[{"uuid": "GPU-a", "index": 0}, {"uuid": "GPU-a", "index": 1}]', "same uuid"),
        ('[{"uuid": "GPU-a", "index": 0}, {"uuid": "GPU-b", "index": 0}]', "same index"),
    ],
)
def test_a_malformed_knob_is_invalid_input_naming_it(value: str, why: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        find(Spec(True), knob(value))
    assert why in caught.value.message
    assert caught.value.message.startswith(gpus.TEST_GPUS_ENV)
    assert caught.value.detail["name"] == gpus.TEST_GPUS_ENV


def test_a_declared_device_without_model_or_memory_has_defaults() -> None:
    assert find(Spec(True), knob('[{"uuid": "GPU-x", "index": 3}]')) == (
        Device("GPU-x", 3, "unknown", None),
    )


class FakeNvml(ModuleType):
    """pynvml as nvidia-ml-py offers it, over a list of devices, recording
    every call; `fail` names a call that raises NVMLError. Its names are
    pynvml's own."""

    class NVMLError(Exception):
        pass

    def __init__(
        self, devices: list[tuple[Any, Any, int]], *, fail: str | None = None, as_bytes: bool
    ) -> None:
        super().__init__("pynvml")
        self.devices = devices
        self.fail = fail
        self.as_bytes = as_bytes
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.fail:
            raise self.NVMLError("Driver Not Loaded")

    def _out(self, text: str) -> Any:
        return text.encode() if self.as_bytes else text

    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._call(f"nvmlDeviceGetHandleByIndex({index})")
        return ("handle", index)

    def nvmlDeviceGetUUID(self, handle: Any) -> Any:
        self._call("nvmlDeviceGetUUID")
        return self._out(self.devices[handle[1]][0])

    def nvmlDeviceGetName(self, handle: Any) -> Any:
        self._call("nvmlDeviceGetName")
        return self._out(self.devices[handle[1]][1])

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        self._call("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(total=self.devices[handle[1]][2], free=0, used=0)


TWO = [("GPU-aaaa-1111", "NVIDIA H100 80GB HBM3", 85520809984), ("GPU-bbbb-2222", "NVIDIA L4", 1)]


@pytest.mark.parametrize("as_bytes", [False, True])
def test_nvml_is_asked_for_each_device_and_shut_down(
    monkeypatch: pytest.MonkeyPatch, as_bytes: bool
) -> None:
    fake = FakeNvml(TWO, as_bytes=as_bytes)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    found = find(Spec(True), {})
    assert found == (
        Device("GPU-aaaa-1111", 0, "NVIDIA H100 80GB HBM3", 85520809984),
        Device("GPU-bbbb-2222", 1, "NVIDIA L4", 1),
    )
    per_device = ["nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo"]
    assert fake.calls == [
        "nvmlInit",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex(0)",
        *per_device,
        "nvmlDeviceGetHandleByIndex(1)",
        *per_device,
        "nvmlShutdown",
    ]
    fake.calls.clear()
    assert find(read_spec("1"), {"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}) == found[1:]
    assert fake.calls[0] == "nvmlInit" and fake.calls[-1] == "nvmlShutdown"


def test_nvml_that_cannot_start_is_a_structured_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(TWO, fail="nvmlInit", as_bytes=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with pytest.raises(InvalidInput) as caught:
        find(Spec(True), {})
    assert "Driver Not Loaded" in caught.value.message and "--gpus none" in caught.value.message
    assert caught.value.detail["flag"] == "--gpus"
    assert fake.calls == ["nvmlInit"], "nothing to shut down"


def test_nvml_failing_on_a_device_still_shuts_down(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(TWO, fail="nvmlDeviceGetName", as_bytes=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with pytest.raises(InvalidInput, match="NVML cannot be used"):
        find(read_spec("0"), {})
    assert fake.calls[-1] == "nvmlShutdown"


def test_a_shutdown_that_fails_leaves_what_was_read(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(TWO, fail="nvmlShutdown", as_bytes=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert [d.uuid for d in find(Spec(True), {})] == ["GPU-aaaa-1111", "GPU-bbbb-2222"]


def test_without_nvidia_ml_py_it_is_extra_missing_naming_the_gpu_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    for spec in (Spec(True), read_spec("0,1")):
        with pytest.raises(ExtraMissing) as caught:
            find(spec, {})
        assert caught.value.detail["extra"] == "gpu"
        assert caught.value.detail["install"] in caught.value.message


def test_importing_the_module_does_not_load_pynvml() -> None:
    source = Path(gpus.__file__ or "").read_text(encoding="utf-8")
    imports = [line for line in source.splitlines() if "import pynvml" in line]
    assert imports == ["        import pynvml"], "only inside nvml_devices, lazily"


def test_summary_and_discovery() -> None:
    assert gpus.summary((), None) is None
    assert gpus.summary((), None, looked=True) == "places jobs on no GPU (--gpus found none)"
    assert gpus.summary((DEV_A,), None) == "places jobs on 1 GPU (0 GPU-aaaa-1111)"
    assert gpus.summary(ALL[:2], 64 << 30) == (
        "places jobs on 2 GPUs (0 GPU-aaaa-1111, 1 GPU-bbbb-2222) and a memory budget of 64G"
    )
    found = gpus.discovery()
    assert found["extra"] == "gpu" and found["test_knob"] == gpus.TEST_GPUS_ENV
    assert isinstance(found["available"], bool)
