"""The codemods on the real Qwen2.5-VL files of several transformers releases (from their wheels),
and the rewritten installed release run side by side with the stock classes."""

from __future__ import annotations

import importlib
import sys
import types
import uuid
from pathlib import Path

import libcst as cst
import pytest

from pto_patch.model.injections_found import find_injections
from pto_patch.model.spec import OPS, load_spec
from pto_patch.patching.codemods import PatchContext, rewrite_configuration, rewrite_modeling
from tests.release_sources import FILES, RELEASES, ReleaseUnavailable, installed_folder

SPEC = load_spec("gutenocr_3b")
SIBLING = SPEC.configuration_file.removesuffix(".py")
INSTALLED = "installed"


def read(path: Path) -> str:
    return path.read_bytes().decode("utf-8")  # keeps the line endings as they are


@pytest.fixture(scope="module", params=[*RELEASES, INSTALLED])
def sources(request, transformers_release) -> tuple[str, str, str, str, str]:
    """(release, modeling source, configuration source, both rewritten with every op)."""
    if request.param == INSTALLED:
        try:
            folder = installed_folder()
        except ReleaseUnavailable as exc:
            pytest.skip(str(exc))
        release = importlib.metadata.version("transformers")
    else:
        folder, release = transformers_release(request.param), request.param
    modeling, configuration = (read(folder / name) for name in FILES)
    ctx = PatchContext(spec=SPEC, release=release)
    return (
        release,
        modeling,
        configuration,
        rewrite_modeling(modeling, ctx),
        rewrite_configuration(configuration, ctx),
    )


class Facts(cst.CSTVisitor):
    """Class names defined, names imported, and relative imports (module names) anywhere in a file."""

    def __init__(self) -> None:
        super().__init__()
        self.classes: set[str] = set()
        self.imported: set[str] = set()
        self.relative: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.add(node.name.value)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        # only import lines matter: skipping every other line's expressions keeps this fast
        return any(isinstance(small, cst.ImportFrom) for small in node.body)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative:
            self.relative.append(
                "." * len(node.relative) + (cst.Module([]).code_for_node(node.module) if node.module else "")
            )
        if not isinstance(node.names, cst.ImportStar):
            self.imported.update(alias.evaluated_alias or alias.evaluated_name for alias in node.names)


def facts(source: str) -> Facts:
    collected = Facts()
    cst.parse_module(source).visit(collected)
    return collected


def test_every_injection_lands_once_and_the_result_compiles(sources):
    _, _, _, patched, patched_configuration = sources
    found = find_injections(patched)
    assert sorted(found) == sorted(OPS)
    assert all(len(targets) == 1 for targets in found.values()), found
    compile(patched, SPEC.modeling_file, "exec")
    compile(patched_configuration, SPEC.configuration_file, "exec")


def test_no_relative_import_remains_but_the_sibling_configuration(sources):
    _, modeling, _, patched, patched_configuration = sources
    assert facts(modeling).relative  # the check below can fail: there were relative imports
    assert set(facts(patched).relative) == {f".{SIBLING}"}
    assert facts(patched_configuration).relative == []


def test_no_written_class_is_named_like_a_transformers_class(sources):
    release, modeling, configuration, patched, patched_configuration = sources
    original = facts(modeling)
    builtin = original.classes | original.imported | facts(configuration).classes
    written = facts(patched).classes | facts(patched_configuration).classes
    assert not written & builtin
    if release == importlib.metadata.version("transformers"):
        import transformers

        assert [name for name in written if hasattr(transformers, name)] == []


@pytest.mark.parametrize("ops", [("rms_norm",), ("mrope", "swiglu_mlp")])
def test_ops_subsets_inject_only_those_ops(sources, ops):
    release, modeling, *_ = sources
    found = find_injections(rewrite_modeling(modeling, PatchContext(spec=SPEC, ops=ops, release=release)))
    assert sorted(found) == sorted(ops)


# --- behaviour: the rewritten installed release next to the stock classes ------------------------


def rotate_half(x):
    half = x.shape[-1] // 2
    return __import__("torch").cat((-x[..., half:], x[..., :half]), dim=-1)


def counting_kernels() -> types.ModuleType:
    """A stand-in `pto_kernels`: counts calls and does the math in plain torch."""
    import torch

    kernels = types.ModuleType("pto_kernels")
    kernels.calls = {op: 0 for op in OPS}
    for op in OPS:
        setattr(kernels, f"USE_PTO_{op.upper()}", False)

    def rms_norm_wrapper(hidden_states, weight, eps=1e-6):
        kernels.calls["rms_norm"] += 1
        x = hidden_states.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x.to(hidden_states.dtype)

    def swiglu_mlp_wrapper(module, hidden_states):
        kernels.calls["swiglu_mlp"] += 1
        return module.down_proj(
            module.act_fn(module.gate_proj(hidden_states)) * module.up_proj(hidden_states)
        )

    def rotate(q, k, cos, sin):
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    def mrope_mixed_wrapper(q, k, cos, sin, unsqueeze_dim=1):
        kernels.calls["mrope"] += 1
        return rotate(q, k, cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim))

    def mrope_pto_correct(q, k, cos, sin, mrope_section, unsqueeze_dim=1):
        kernels.calls["mrope"] += 1
        return sectioned(q, k, cos, sin, mrope_section, unsqueeze_dim)

    def sectioned(q, k, cos, sin, mrope_section, unsqueeze_dim=1):
        sections = list(mrope_section) * 2
        cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(sections, dim=-1))], dim=-1)
        sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(sections, dim=-1))], dim=-1)
        return rotate(q, k, cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim))

    def residual_rms_norm_wrapper(hidden_states, residual, norm):
        kernels.calls["residual_rms_norm"] += 1
        summed = residual + hidden_states
        return rms_norm(summed, norm), summed

    def rms_norm(x, norm):
        return rms_norm_wrapper_math(x, norm.weight, norm.variance_epsilon)

    def rms_norm_wrapper_math(hidden_states, weight, eps):
        x = hidden_states.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x.to(hidden_states.dtype)

    def mlp_block_wrapper(residual, attn_output, o_proj, norm, mlp):
        kernels.calls["mlp_block"] += 1
        summed = residual + o_proj(attn_output)
        normed = rms_norm(summed, norm)
        return summed + mlp.down_proj(mlp.act_fn(mlp.gate_proj(normed)) * mlp.up_proj(normed))

    def heads(attention, norm, hidden_states):
        normed = rms_norm(hidden_states, norm)
        b, s = hidden_states.shape[:2]
        return [
            proj(normed).view(b, s, -1, attention.head_dim).transpose(1, 2)
            for proj in (attention.q_proj, attention.k_proj, attention.v_proj)
        ]

    def attention_prologue_wrapper(attention, norm, hidden_states, cos, sin, mrope_section):
        kernels.calls["attention_prologue"] += 1
        q, k, v = heads(attention, norm, hidden_states)
        return (*sectioned(q, k, cos, sin, mrope_section), v)

    def attention_prologue_mixed_wrapper(attention, norm, hidden_states, cos, sin):
        kernels.calls["attention_prologue"] += 1
        q, k, v = heads(attention, norm, hidden_states)
        return (*rotate(q, k, cos.unsqueeze(1), sin.unsqueeze(1)), v)

    def attention_core_model_wrapper(attention, query, keys, values, attention_mask):
        """The new rows of one sequence over its first kv_len cached positions, causal among themselves;
        kv_len: what the mask's last row sees (all the keys without a mask)."""
        kernels.calls["attention_core"] += 1
        b, heads, rows, dim = query.shape
        if attention_mask is None:
            kv_len = keys.shape[2]
        else:
            last = attention_mask[:, 0, -1, : keys.shape[2]]
            kv_len = int((last if last.dtype == torch.bool else last == 0).sum())
        groups = heads // keys.shape[1]
        k, v = (t[:, :, :kv_len].repeat_interleave(groups, dim=1) for t in (keys, values))
        scores = torch.matmul(query, k.transpose(2, 3)) * attention.scaling
        visible = torch.arange(kv_len)[None, :] <= (kv_len - rows + torch.arange(rows))[:, None]
        scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        return torch.matmul(weights, v).transpose(1, 2).reshape(b, rows, heads * dim)

    kernels.attention_core_model_wrapper = attention_core_model_wrapper
    kernels.rms_norm_wrapper = rms_norm_wrapper
    kernels.swiglu_mlp_wrapper = swiglu_mlp_wrapper
    kernels.mrope_mixed_wrapper = mrope_mixed_wrapper
    kernels.mrope_pto_correct = mrope_pto_correct
    kernels.residual_rms_norm_wrapper = residual_rms_norm_wrapper
    kernels.mlp_block_wrapper = mlp_block_wrapper
    kernels.attention_prologue_wrapper = attention_prologue_wrapper
    kernels.attention_prologue_mixed_wrapper = attention_prologue_mixed_wrapper

    # the prologue's cache-writing forms: these never write (a dynamic cache), so the update runs as written
    def attention_prologue_cache_wrapper(attention, norm, hidden_states, cos, sin, mrope_section, cache, at):
        return (*attention_prologue_wrapper(attention, norm, hidden_states, cos, sin, mrope_section), False)

    def attention_prologue_mixed_cache_wrapper(attention, norm, hidden_states, cos, sin, cache, at):
        return (*attention_prologue_mixed_wrapper(attention, norm, hidden_states, cos, sin), False)

    kernels.attention_prologue_cache_wrapper = attention_prologue_cache_wrapper
    kernels.attention_prologue_mixed_cache_wrapper = attention_prologue_mixed_cache_wrapper
    return kernels


def tiny_config_kwargs() -> dict:
    text = dict(SPEC.tiny["text"])
    section = text.pop("mrope_section")
    text.update(vocab_size=384, rms_norm_eps=1e-6, rope_scaling={"type": "mrope", "mrope_section": section})
    vision = dict(SPEC.tiny["vision"], out_hidden_size=text["hidden_size"])
    return dict(text, text_config=dict(text), vision_config=vision)


@pytest.fixture(scope="module")
def patched_package(tmp_path_factory):
    """The installed release's files, rewritten, imported as a package from a temp dir."""
    pytest.importorskip("torch")
    release = importlib.metadata.version("transformers")
    folder = installed_folder()
    ctx = PatchContext(spec=SPEC, release=release)
    package_name = f"pto_patched_{uuid.uuid4().hex[:8]}"
    package = tmp_path_factory.mktemp("patched") / package_name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / SPEC.modeling_file).write_text(rewrite_modeling(read(folder / SPEC.modeling_file), ctx))
    (package / SPEC.configuration_file).write_text(
        rewrite_configuration(read(folder / SPEC.configuration_file), ctx)
    )
    sys.path.insert(0, str(package.parent))
    try:
        yield importlib.import_module(f"{package_name}.{SPEC.modeling_file.removesuffix('.py')}")
    finally:
        sys.path.remove(str(package.parent))


def test_rewritten_model_calls_each_switched_on_op_and_matches_the_stock_logits(patched_package, monkeypatch):
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config_module = sys.modules[patched_package.__name__.rpartition(".")[0] + ".configuration_qwen2_5_vl"]
    torch.manual_seed(0)
    stock = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**tiny_config_kwargs())).eval()
    patched_class = getattr(patched_package, SPEC.renamed("Qwen2_5_VLForConditionalGeneration"))
    patched = patched_class(config_module.GutenOcr3BVLConfig(**tiny_config_kwargs())).eval()
    patched.load_state_dict(stock.state_dict())
    kernels = counting_kernels()
    monkeypatch.setitem(sys.modules, "pto_kernels", kernels)
    input_ids = torch.tensor([[3, 17, 42, 5, 99, 7]])
    with torch.no_grad():
        expected = stock(input_ids=input_ids).logits
        switched_off = patched(input_ids=input_ids).logits
        assert kernels.calls == {op: 0 for op in OPS}
        torch.testing.assert_close(switched_off, expected, rtol=0, atol=0)
        for op in OPS:
            kernels.calls = {name: 0 for name in OPS}
            setattr(kernels, f"USE_PTO_{op.upper()}", True)
            switched_on = patched(input_ids=input_ids).logits
            setattr(kernels, f"USE_PTO_{op.upper()}", False)
            assert kernels.calls[op] > 0 and sum(kernels.calls.values()) == kernels.calls[op], (
                op,
                kernels.calls,
            )
            torch.testing.assert_close(switched_on, expected, rtol=1e-5, atol=1e-5)
