"""PyPTO's NPU pre-flight checks and settings (pypto_device.py) on fake CANN trees, without an NPU or pypto."""

import os
import sys
import types
from pathlib import Path

import pytest
import torch
from pto_kernels.backends import pypto_device, pypto_ops, pypto_runtime

REAL_MAPS = "7f00-7f01 r-xp 0 08:01 1 /venv/pypto/lib/libtile_fwk_runtime.so\n"
STUB_MAPS = "7f00-7f01 r-xp 0 08:01 1 /venv/pypto/lib/libtile_fwk_runtime_stub.so\n"


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def fake_cann(root: Path) -> dict[str, str]:
    """A CANN install with what pypto 0.2's NPU compile looks for, and an environment that points at it."""
    home = root / "Ascend" / "ascend-toolkit" / "latest"
    bisheng = _executable(home / "compiler" / "ccec_compiler" / "bin" / "bisheng")
    _executable(home / pypto_device.AICPU_COMPILER)
    (home / pypto_device.PTO_HEADERS).mkdir(parents=True)
    (root / "user").mkdir()
    return {
        "ASCEND_HOME_PATH": str(home),
        "PATH": f"{bisheng.parent}{os.pathsep}/usr/bin",
        "HOME": str(root / "user"),
        "PTO_KERNELS_CACHE_DIR": str(root / "cache"),
    }


def test_a_complete_tree_is_ready(tmp_path):
    env = fake_cann(tmp_path)
    found = pypto_device.preflight(env, pypto_imported=True, maps_text=REAL_MAPS)
    assert found.ready and found.reason is None, found.to_json()
    assert [c.name for c in found.checks] == [
        "ascend_home",
        "runtime",
        "bisheng",
        "pto_headers",
        "aicpu_toolchain",
        "output_dir",
        "binary_cache",
    ]
    assert found.output_dir == str(tmp_path / "cache" / "pypto-output")
    assert found.binary_cache_dir == str(tmp_path / "user" / "ast_data")


def _break(env, tmp_path, what):
    home = Path(env["ASCEND_HOME_PATH"])
    if what == "unset":
        del env["ASCEND_HOME_PATH"]
    elif what == "not a folder":
        env["ASCEND_HOME_PATH"] = str(tmp_path / "nowhere")
    elif what == "bisheng":
        env["PATH"] = "/usr/bin"
    elif what == "headers":
        (home / pypto_device.PTO_HEADERS).rmdir()
    elif what == "aicpu":
        (home / pypto_device.AICPU_COMPILER).chmod(0o644)
    elif what == "output":
        (tmp_path / "a-file").write_text("")
        env["TILE_FWK_OUTPUT_DIR"] = str(tmp_path / "a-file" / "out")
    elif what == "home":
        (tmp_path / "home-file").write_text("")
        env["HOME"] = str(tmp_path / "home-file")
    elif what == "tile lib":  # set, but no headers there: PyPTO asserts, whatever CANN holds
        env["PTO_TILE_LIB_CODE_PATH"] = str(tmp_path / "pto-isa")


@pytest.mark.parametrize(
    ("what", "reason"),
    [
        ("unset", "ASCEND_HOME_PATH is not set: source CANN's set_env.sh"),
        ("not a folder", "is not a folder: source CANN's set_env.sh"),
        ("bisheng", "bisheng (the AI Core compiler) is not on PATH: add "),
        ("headers", "include/pto is missing: install the CANN toolkit"),
        ("aicpu", "aarch64-target-linux-gnu-g++ is missing or not executable: install CANN's toolkit"),
        ("output", "out is not writable (Not a directory): set TILE_FWK_OUTPUT_DIR or PTO_KERNELS_CACHE_DIR"),
        ("home", "ast_data is not writable (Not a directory): make $HOME writable"),
        (
            "tile lib",
            "pto-isa/include/pto (from PTO_TILE_LIB_CODE_PATH) is missing: point PTO_TILE_LIB_CODE_PATH",
        ),
    ],
)
def test_each_missing_piece_is_one_line_with_what_to_do(tmp_path, what, reason):
    env = fake_cann(tmp_path)
    _break(env, tmp_path, what)
    found = pypto_device.preflight(env, pypto_imported=False)
    assert not found.ready
    assert found.reason.startswith("pypto cannot compile for the NPU: ")
    assert reason in found.reason and "\n" not in found.reason


def test_pypto_imported_before_ascend_home_path_loads_the_stub(tmp_path):
    found = pypto_device.preflight(fake_cann(tmp_path), pypto_imported=True, maps_text=STUB_MAPS)
    assert found.reason == (
        "pypto cannot compile for the NPU: pypto's stub runtime is loaded: pypto was imported before"
        " ASCEND_HOME_PATH was set: export it before Python starts"
    )


def test_the_loaded_runtime_is_read_from_the_memory_map():
    assert pypto_device.loaded_runtime(REAL_MAPS) == "real"
    assert pypto_device.loaded_runtime(STUB_MAPS) == "stub"
    assert pypto_device.loaded_runtime("7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n") == "none"


def test_folders_follow_the_hub_conventions(tmp_path):
    home = str(tmp_path / "h")
    assert pypto_device.cache_root({"HOME": home}) == Path.home() / ".cache" / "pto_kernels"
    assert pypto_device.cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/pto_kernels")
    assert pypto_device.cache_root({"XDG_CACHE_HOME": "/x", "PTO_KERNELS_CACHE_DIR": "/p"}) == Path("/p")
    assert pypto_device.output_dir({"PTO_KERNELS_CACHE_DIR": "/p"}) == Path("/p/pypto-output")
    assert pypto_device.output_dir({"TILE_FWK_OUTPUT_DIR": "/mine"}) == Path("/mine")
    assert pypto_device.binary_cache_dir({"HOME": home}) == tmp_path / "h" / "ast_data"


class StandInPyptoConfig:
    """pypto 0.2.0's pypto/config.py set_global_config / get_global_config: one key space, "global."
    prefixed inside; an unknown key raises there too (RuntimeError from pypto_impl.SetGlobalConfig)."""

    KNOWN = {"pass.enable_binary_cache": False}

    def __init__(self):
        self.values = dict(self.KNOWN)

    def set_global_config(self, key, value):
        if key not in self.values:
            raise RuntimeError(f"unknown config global.{key}")
        self.values[key] = value

    def get_global_config(self, key):
        return self.values[key]


def test_prepare_sets_the_output_folder_and_the_binary_cache(tmp_path, monkeypatch):
    env = fake_cann(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TILE_FWK_OUTPUT_DIR", raising=False)
    config = StandInPyptoConfig()
    monkeypatch.setitem(sys.modules, "pypto", types.SimpleNamespace(config=config))
    real_preflight = pypto_device.preflight
    monkeypatch.setattr(
        pypto_device, "preflight", lambda *a, **k: real_preflight(*a, **k, **({"maps_text": REAL_MAPS}))
    )
    pypto_device.reset()
    try:
        found = pypto_device.prepare()
        assert found.ready
        assert os.environ["TILE_FWK_OUTPUT_DIR"] == str(tmp_path / "cache" / "pypto-output")
        assert config.values["pass.enable_binary_cache"] is True
        assert found.settings == {"TILE_FWK_OUTPUT_DIR": found.output_dir, "binary_cache": True}
        assert pypto_device.prepare() is found  # once per process
    finally:
        pypto_device.reset()


def test_prepare_keeps_the_users_output_folder(tmp_path, monkeypatch):
    env = fake_cann(tmp_path) | {"TILE_FWK_OUTPUT_DIR": str(tmp_path / "mine")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(sys.modules, "pypto", types.SimpleNamespace(config=StandInPyptoConfig()))
    real_preflight = pypto_device.preflight
    monkeypatch.setattr(
        pypto_device, "preflight", lambda *a, **k: real_preflight(*a, **k, maps_text=REAL_MAPS)
    )
    pypto_device.reset()
    try:
        assert pypto_device.prepare().settings["TILE_FWK_OUTPUT_DIR"] == str(tmp_path / "mine")
    finally:
        pypto_device.reset()


def test_an_npu_kernel_here_falls_back_with_the_reason_counted(monkeypatch):
    """This machine has no CANN: an NPU call of the real pypto entry raises the pre-flight reason, and the
    dispatcher serves it from the torch path, counted, every time."""
    import pto_kernels

    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    monkeypatch.setattr(pypto_runtime, "device_type_of", lambda tensor: "npu")
    pypto_device.reset()
    built = []
    monkeypatch.setattr(pypto_ops, "_build_rms_norm", lambda *args: built.append(args))
    x, weight = torch.randn(1, 3, 64), torch.rand(64) + 0.5
    try:
        with pto_kernels.enabled(("rms_norm",), backend="pypto"):
            first = pto_kernels.rms_norm_wrapper(x, weight, 1e-6)
            pto_kernels.rms_norm_wrapper(x, weight, 1e-6)
            stats = pto_kernels.stats()["rms_norm"]
    finally:
        pypto_device.reset()
    assert built == []  # nothing was built, let alone compiled
    assert stats["fallbacks"] == 2 and stats["backends"] == {"torch": 2}
    assert stats["first_fallback_error"] == (
        "pypto: DeviceNotReadyError: pypto cannot compile for the NPU: ASCEND_HOME_PATH is not set:"
        f" {pypto_device.SET_ENV_HINT}"
    )
    variance = x.pow(2).mean(-1, keepdim=True)
    torch.testing.assert_close(first, weight * (x * torch.rsqrt(variance + 1e-6)))


def test_no_kernel_compiles_inside_a_graph_capture(monkeypatch):
    monkeypatch.setattr(pypto_device, "prepare", lambda: None)
    monkeypatch.setattr(pypto_device, "capturing", lambda device_type: True)
    with pytest.raises(pypto_device.CompileDuringCaptureError, match="run the model eagerly once"):
        pypto_runtime.cached_kernel(("rms_norm", "test-capture"), "npu", lambda: pytest.fail("built"))
    pypto_runtime.KERNELS.get(("rms_norm", "test-capture"), lambda: types.SimpleNamespace(compile=None))
    try:  # compiled before the capture: replayed as it is
        assert pypto_runtime.cached_kernel(("rms_norm", "test-capture"), "npu", lambda: pytest.fail("built"))
    finally:
        pypto_runtime.KERNELS.clear()


class StandInNpu:
    """torch_npu's torch.npu.current_device / set_device (torch_npu/npu/utils.py): set_device takes an int or
    a torch.device and refuses an index past the devices there, as _npu_setDevice does."""

    def __init__(self, count=2):
        self.count, self.current, self.history = count, 0, []

    def current_device(self):
        return self.current

    def set_device(self, device):
        index = device.index if isinstance(device, torch.device) else device
        if not isinstance(index, int) or not 0 <= index < self.count:
            raise RuntimeError(f"Invalid device id {device!r}")
        self.current = index
        self.history.append(index)


def _npu(index):
    return types.SimpleNamespace(type="npu", index=index)  # torch.device("npu") needs torch_npu loaded


def test_the_launch_runs_on_the_tensors_npu_and_puts_the_current_one_back(monkeypatch):
    npu = StandInNpu()
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    seen = []
    with pypto_device.on_device(_npu(1)):
        seen.append(npu.current_device())
    assert seen == [1] and npu.current_device() == 0 and npu.history == [1, 0]
    with pypto_device.on_device(_npu(0)):  # already current: nothing set
        pass
    assert npu.history == [1, 0]
    with pytest.raises(ValueError), pypto_device.on_device(_npu(1)):
        raise ValueError("the launch failed")
    assert npu.current_device() == 0  # put back after a failure too


def test_pto_isa_headers_are_looked_for_where_pypto_looks_first(tmp_path):
    """$PTO_TILE_LIB_CODE_PATH/include/pto before CANN's: with it set and there, CANN's may be missing."""
    env = fake_cann(tmp_path)
    (Path(env["ASCEND_HOME_PATH"]) / pypto_device.PTO_HEADERS).rmdir()
    (tmp_path / "pto-isa" / pypto_device.PTO_HEADERS).mkdir(parents=True)
    env["PTO_TILE_LIB_CODE_PATH"] = str(tmp_path / "pto-isa")
    found = pypto_device.preflight(env, pypto_imported=False)
    (headers,) = [c for c in found.checks if c.name == "pto_headers"]
    assert headers.ok and "from PTO_TILE_LIB_CODE_PATH" in headers.detail, headers


def test_the_interpreter_builds_as_cpp20_where_torchs_headers_need_it(tmp_path, monkeypatch):
    """torch 2.14's headers refuse C++17, which pypto 0.2's interpreter CMakeLists pins: pto_kernels builds a
    copy that asks for C++20, beside links to pypto's libraries (found by the copy as `..`)."""
    lib = tmp_path / "pypto" / "lib"
    (lib / "calculator").mkdir(parents=True)
    (lib / "calculator" / "CMakeLists.txt").write_text("project(x)\nset(CMAKE_CXX_STANDARD 17)\n")
    (lib / "libc_sec.so").write_text("")
    manager = types.SimpleNamespace(pkg_lib_dir=str(lib))
    monkeypatch.setattr(pypto_runtime, "torch_headers_need_cxx20", lambda: False)
    assert pypto_runtime._calculator_source(manager, tmp_path / "build") == lib / "calculator"
    monkeypatch.setattr(pypto_runtime, "torch_headers_need_cxx20", lambda: True)
    copy = pypto_runtime._calculator_source(manager, tmp_path / "build")
    assert copy == tmp_path / "build" / "src" / "calculator"
    assert "set(CMAKE_CXX_STANDARD 20)" in (copy / "CMakeLists.txt").read_text()
    assert (copy.parent / "libc_sec.so").resolve() == (lib / "libc_sec.so").resolve()
    assert (lib / "calculator" / "CMakeLists.txt").read_text().endswith("STANDARD 17)\n")  # pypto's untouched
    assert pypto_runtime._calculator_source(manager, tmp_path / "build") == copy  # made once


def test_torch_2_14s_headers_are_the_ones_that_need_cpp20():
    release = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    assert pypto_runtime.torch_headers_need_cxx20() is (release >= (2, 14))
