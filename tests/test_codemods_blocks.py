"""The decoder-layer block codemods (attention_prologue, attention_core, mlp_block, residual_rms_norm): before
and after on a
small decoder layer written like transformers', the rewritten code run with every switch combination
against the original, their missing anchors, and idempotence."""

import sys
import types

import libcst as cst
import pytest
import torch

from pto_patch.errors import AnchorNotFoundError
from pto_patch.model.injections_found import find_injections
from pto_patch.model.spec import load_spec
from pto_patch.patching.codemods.inject_attention_core import InjectAttentionCore
from pto_patch.patching.codemods.inject_attention_prologue import InjectAttentionPrologue
from pto_patch.patching.codemods.inject_mlp_block import InjectMlpBlock
from pto_patch.patching.codemods.inject_residual_rms_norm import InjectResidualRmsNorm
from pto_patch.patching.patch_context import PatchContext
from tests.helpers.decoder_source import DECODER

FILE = "modeling_qwen2_5_vl.py"

BLOCKS = ("attention_prologue", "attention_core", "mlp_block", "residual_rms_norm")
CODEMODS = {
    "attention_prologue": InjectAttentionPrologue,
    "attention_core": InjectAttentionCore,
    "mlp_block": InjectMlpBlock,
    "residual_rms_norm": InjectResidualRmsNorm,
}


@pytest.fixture(scope="module")
def ctx() -> PatchContext:
    return PatchContext(spec=load_spec("gutenocr_3b"), ops=BLOCKS, release="9.9.9")


def run(codemod, source: str, ctx: PatchContext) -> str:
    return codemod.transform(cst.parse_module(source), ctx, FILE).code


def inject_blocks(source: str, ctx: PatchContext) -> str:
    """The three block codemods in the order rewrite_modeling runs them."""
    for codemod in CODEMODS.values():
        source = run(codemod(), source, ctx)
    return source


def _stand_in_kernels() -> types.ModuleType:
    """A `pto_kernels` whose blocks count their calls and compute with the modules handed to them."""
    kernels = types.ModuleType("pto_kernels")
    kernels.calls = dict.fromkeys(BLOCKS, 0)
    for op in BLOCKS:
        setattr(kernels, f"USE_PTO_{op.upper()}", False)

    def residual_rms_norm_wrapper(hidden_states, residual, norm):
        kernels.calls["residual_rms_norm"] += 1
        return norm(residual + hidden_states), residual + hidden_states

    def mlp_block_wrapper(residual, attn_output, o_proj, norm, mlp):
        kernels.calls["mlp_block"] += 1
        summed = residual + o_proj(attn_output)
        return summed + mlp(norm(summed))

    def attention_prologue_wrapper(attention, norm, hidden_states, cos, sin, section):
        kernels.calls["attention_prologue"] += 1
        normed = norm(hidden_states)
        b, s = hidden_states.shape[:2]
        q, k, v = (
            proj(normed).view(b, s, -1, attention.head_dim).transpose(1, 2)
            for proj in (attention.q_proj, attention.k_proj, attention.v_proj)
        )
        module = sys.modules[type(attention).__module__]
        return (*module.apply_multimodal_rotary_pos_emb(q, k, cos, sin, section), v)

    def attention_core_model_wrapper(attention, query, keys, values, attention_mask):
        kernels.calls["attention_core"] += 1
        module = sys.modules[type(attention).__module__]
        out, _ = module.sdpa_attention_forward(
            attention, query, keys, values, attention_mask, scaling=attention.scaling
        )
        return out.reshape(query.shape[0], query.shape[2], -1)

    kernels.attention_core_model_wrapper = attention_core_model_wrapper
    kernels.residual_rms_norm_wrapper = residual_rms_norm_wrapper
    kernels.mlp_block_wrapper = mlp_block_wrapper
    kernels.attention_prologue_wrapper = attention_prologue_wrapper
    return kernels


def _load(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, name, "exec"), module.__dict__)
    return module


def test_each_block_injects_its_guard_and_nothing_else(ctx):
    for op, codemod in CODEMODS.items():
        assert find_injections(run(codemod(), DECODER, ctx)) == {op: ["Qwen2_5_VLDecoderLayer"]}


def test_mlp_block_before_and_after(ctx):
    after = run(InjectMlpBlock(), DECODER, ctx)
    layer = after[after.index("class Qwen2_5_VLDecoderLayer") :]
    assert '        """A decoder layer."""\n        pto_kernels = sys.modules.get("pto_kernels")\n' in layer
    assert (
        '        if pto_kernels is not None and getattr(pto_kernels, "USE_PTO_MLP_BLOCK", False):\n'
        '            kwargs["pto_defer_o_proj"] = True\n'
    ) in layer
    run_block = " ".join(layer[layer.index("if kwargs.get") :].split())
    assert run_block.startswith(
        'if kwargs.get("pto_defer_o_proj", False): hidden_states = sys.modules["pto_kernels"].mlp_block_wrapper('
        "residual, hidden_states, self.self_attn.o_proj, self.post_attention_layernorm, self.mlp) "
        "else: hidden_states = residual + hidden_states # Fully Connected residual = hidden_states"
    )
    attention = after[after.index("class Qwen2_5_VLAttention") : after.index("class Qwen2_5_VLDecoderLayer")]
    assert 'pto_defer_o_proj = kwargs.pop("pto_defer_o_proj", False)' in attention
    assert (
        "        if not pto_defer_o_proj:\n            attn_output = self.o_proj(attn_output)\n" in attention
    )
    assert after.startswith("import sys\n")


def test_attention_prologue_keeps_what_the_block_does_not_replace(ctx):
    after = run(InjectAttentionPrologue(), DECODER, ctx)
    attention = after[after.index("class Qwen2_5_VLAttention") : after.index("class Qwen2_5_VLDecoderLayer")]
    block = attention[
        attention.index("if pto_input_layernorm is not None:") : attention.index("        else:")
    ]
    # cos, sin are still unpacked (the rest of the forward may read them); the projections are not run
    assert "cos, sin = position_embeddings" in block and "self.q_proj" not in block
    assert "attention_prologue_wrapper(\n" in block and "self.section" in block
    layer = after[after.index("class Qwen2_5_VLDecoderLayer") :]
    assert (
        'if "pto_input_layernorm" not in kwargs:\n            hidden_states = self.input_layernorm' in layer
    )


@pytest.mark.parametrize(
    "switched_on",
    [
        (),
        ("attention_prologue",),
        ("mlp_block",),
        ("residual_rms_norm",),
        ("mlp_block", "residual_rms_norm"),
        BLOCKS,
    ],
    ids=lambda ops: "+".join(ops) or "off",
)
def test_rewritten_layer_runs_the_switched_on_blocks_and_matches_the_original(ctx, switched_on, monkeypatch):
    patched_source = inject_blocks(DECODER, ctx)
    original = _load(DECODER, "small_original")
    patched = _load(patched_source, "small_patched")
    kernels = _stand_in_kernels()
    monkeypatch.setitem(sys.modules, "pto_kernels", kernels)
    torch.manual_seed(0)
    layer = original.Qwen2_5_VLDecoderLayer()
    patched_layer = patched.Qwen2_5_VLDecoderLayer()
    patched_layer.load_state_dict(layer.state_dict())
    x = torch.randn(2, 3, 32)
    angles = torch.randn(3, 2, 3, 4).repeat(1, 1, 1, 2)
    tables = (angles.cos(), angles.sin())
    for op in switched_on:
        setattr(kernels, f"USE_PTO_{op.upper()}", True)
    with torch.no_grad():
        expected = layer(x, position_embeddings=tables)
        actual = patched_layer(x, position_embeddings=tables)
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)
    ran = {op for op, calls in kernels.calls.items() if calls}
    # mlp_block does the residual add + norm itself: with both on, only mlp_block runs; the attention core
    # runs at a batch of 2 (3 new rows a sequence)
    assert ran == set(switched_on) - ({"residual_rms_norm"} if "mlp_block" in switched_on else set())


@pytest.mark.parametrize(
    "batch, window, declines, runs",
    [(1, None, False, True), (4, None, False, True), (1, 4, False, False), (4, None, True, True)],
    ids=["one", "batch", "window", "declined"],
)
def test_the_attention_core_replaces_the_attention_function_at_a_decode_step(
    ctx, batch, window, declines, runs, monkeypatch
):
    """The op runs at every batch; a sliding-window layer keeps the model's function, and so does a call the
    op's wrapper declines (None: a mask that is not one range a sequence)."""
    original = _load(DECODER, "small_original_core")
    patched = _load(inject_blocks(DECODER, ctx), "small_patched_core")
    kernels = _stand_in_kernels()
    kernels.USE_PTO_ATTENTION_CORE = True
    if declines:
        counted = kernels.attention_core_model_wrapper

        def declined(*args):
            counted(*args)  # counted, its output dropped: the layer must still match the original
            return None

        kernels.attention_core_model_wrapper = declined
    monkeypatch.setitem(sys.modules, "pto_kernels", kernels)
    torch.manual_seed(0)
    layer, patched_layer = original.Qwen2_5_VLDecoderLayer(), patched.Qwen2_5_VLDecoderLayer()
    patched_layer.load_state_dict(layer.state_dict())
    patched_layer.self_attn.sliding_window = window  # a sliding-window layer keeps the model's attention
    x, angles = torch.randn(batch, 1, 32), torch.randn(3, batch, 1, 4).repeat(1, 1, 1, 2)
    with torch.no_grad():
        expected = layer(x, position_embeddings=(angles.cos(), angles.sin()))
        actual = patched_layer(x, position_embeddings=(angles.cos(), angles.sin()))
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)
    assert kernels.calls["attention_core"] == int(runs)


def test_attention_core_before_and_after(ctx):
    after = run(InjectAttentionCore(), DECODER, ctx)
    layer = after[after.index("class Qwen2_5_VLDecoderLayer") :]
    assert (
        '        if pto_kernels is not None and getattr(pto_kernels, "USE_PTO_ATTENTION_CORE", False):\n'
        '            kwargs["pto_attention_core"] = True\n'
    ) in layer
    attention = after[after.index("class Qwen2_5_VLAttention") : after.index("class Qwen2_5_VLDecoderLayer")]
    assert 'pto_attention_core = kwargs.pop("pto_attention_core", False)' in attention
    run_block = " ".join(attention[attention.index("if pto_attention_core") :].split())
    assert run_block.startswith(
        "if pto_attention_core and query_states.shape[2] <= 16 "
        'and not getattr(self, "sliding_window", None): '
        'attn_output = sys.modules["pto_kernels"].attention_core_model_wrapper(self, query_states, key_states, '
        "value_states, attention_mask) attn_weights = None if attn_output is None: "
        "attn_output, attn_weights = attention_interface("
    )
    assert "attn_output = None if pto_attention_core" in " ".join(attention.split())


def test_a_wrong_block_is_caught_by_the_comparison(ctx, monkeypatch):
    """The comparison above can fail: a block that drops its first residual add differs from the layer."""
    patched = _load(inject_blocks(DECODER, ctx), "small_patched_wrong")
    kernels = _stand_in_kernels()
    kernels.mlp_block_wrapper = lambda residual, attn, o_proj, norm, mlp: (
        o_proj(attn) + mlp(norm(o_proj(attn)))
    )
    kernels.USE_PTO_MLP_BLOCK = True
    monkeypatch.setitem(sys.modules, "pto_kernels", kernels)
    torch.manual_seed(0)
    layer = patched.Qwen2_5_VLDecoderLayer()
    x, angles = torch.randn(1, 2, 32), torch.randn(3, 1, 2, 4).repeat(1, 1, 1, 2)
    with torch.no_grad():
        actual = layer(x, position_embeddings=(angles.cos(), angles.sin()))
        kernels.USE_PTO_MLP_BLOCK = False
        expected = layer(x, position_embeddings=(angles.cos(), angles.sin()))
    assert not torch.allclose(actual, expected, rtol=1e-6, atol=1e-6)


def test_blocks_are_injected_once(ctx):
    once = inject_blocks(DECODER, ctx)
    for codemod in CODEMODS.values():
        assert run(codemod(), once, ctx) == once


@pytest.mark.parametrize(
    ("op", "change", "message"),
    [
        ("attention_prologue", ("Qwen2_5_VLDecoderLayer", "OtherLayer"), "no decoder layer class"),
        (
            "attention_prologue",
            ("        hidden_states = self.input_layernorm(hidden_states)\n", ""),
            "before its attention",
        ),
        ("attention_prologue", ("apply_multimodal_rotary_pos_emb(\n", "rotate_all(\n"), "q/k/v projections"),
        ("mlp_block", ("        hidden_states = self.mlp(hidden_states)\n", ""), "residual add, norm, MLP"),
        (
            "attention_core",
            ("attn_output, attn_weights = attention_interface(", "attn_output = attention_interface("),
            "no `attn_output, attn_weights",
        ),
        ("mlp_block", ("        attn_output = self.o_proj(attn_output)\n", ""), "o_proj"),
        (
            "mlp_block",
            ('position_embeddings=None, **kwargs):\n        """', 'position_embeddings=None):\n        """'),
            "kwargs",
        ),
        (
            "residual_rms_norm",
            (
                "        residual = hidden_states\n        hidden_states = self.post",
                "        hidden_states = self.post",
            ),
            "residual copy",
        ),
    ],
)
def test_a_missing_anchor_names_what_is_missing_and_hints(ctx, op, change, message):
    source = DECODER.replace(*change)
    assert source != DECODER
    with pytest.raises(AnchorNotFoundError, match=message) as caught:
        run(CODEMODS[op](), source, ctx)
    assert caught.value.hint and op in str(caught.value) + caught.value.hint


# The attention with a KV-cache update after its rotary call, as transformers 5.16 (past_key_values, the
# layer's own length) and 4.57 (cache_kwargs with the attention's cache_position) write it.
_ROTARY_END = """            query_states, key_states, cos, sin, self.section
        )
"""
_UPDATES = {
    "5.16": (
        "past_key_values=None, ",
        """        if past_key_values is not None:
            key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx)
""",
    ),
    "4.57": (
        "past_key_values=None, cache_position=None, ",
        """        if past_key_values is not None:
            cache_kwargs = {"sin": sin, "cos": cos, "cache_position": cache_position}
            key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx, cache_kwargs)
""",
    ),
}


def _with_update(release: str, targets: str = "key_states, value_states") -> str:
    params, update = _UPDATES[release]
    source = DECODER.replace(
        "def forward(self, hidden_states, position_embeddings=None, attention_mask=None, ",
        f"def forward(self, hidden_states, position_embeddings=None, attention_mask=None, {params}",
    )
    source = source.replace(
        "        self.section = [2, 1, 1]\n", "        self.section = [2, 1, 1]\n        self.layer_idx = 0\n"
    )
    return source.replace(
        _ROTARY_END, _ROTARY_END + update.replace("key_states, value_states =", f"{targets} =")
    )


@pytest.mark.parametrize("release, position", [("5.16", "None"), ("4.57", "cache_position")])
def test_attention_prologue_before_and_after_with_a_cache_update(ctx, release, position):
    after = run(InjectAttentionPrologue(), _with_update(release), ctx)
    attention = after[after.index("class Qwen2_5_VLAttention") : after.index("class Qwen2_5_VLDecoderLayer")]
    flat = " ".join(attention.split())
    assert 'pto_input_layernorm = kwargs.pop("pto_input_layernorm", None) pto_cache_written = False' in flat
    assert (
        "query_states, key_states, value_states, pto_cache_written = "
        'sys.modules["pto_kernels"].attention_prologue_cache_wrapper( self, pto_input_layernorm, hidden_states, '
        f"cos, sin, self.section, past_key_values, {position} )"
    ) in flat
    assert "if not pto_cache_written: if past_key_values is not None:" in flat
    assert flat.count(".update(key_states, value_states, self.layer_idx") == 1


@pytest.mark.parametrize("other", ["targets", "layer"])
def test_an_update_of_other_tensors_or_another_layer_is_left_as_it_is(ctx, other):
    """Only the update of the prologue's own k and v, for its own layer, is the one its op can do."""
    source = _with_update("5.16", "other_k, other_v") if other == "targets" else _with_update("5.16")
    if other == "layer":  # as a model whose layers share another layer's cache would write it
        source = source.replace("value_states, self.layer_idx)", "value_states, self.kv_shared_layer_index)")
    after = run(InjectAttentionPrologue(), source, ctx)
    assert "pto_cache_written" not in after and "attention_prologue_wrapper(" in after


class _CountingCache:
    def __init__(self):
        self.updates = 0

    def update(self, key_states, value_states, layer_idx, *args):
        self.updates += 1
        return key_states, value_states


@pytest.mark.parametrize("written", [True, False])
def test_the_update_runs_only_when_the_prologue_did_not_write(ctx, written, monkeypatch):
    patched = _load(inject_blocks(_with_update("5.16"), ctx), f"small_patched_update_{written}")
    kernels = _stand_in_kernels()
    seen = []

    def attention_prologue_cache_wrapper(attention, norm, hidden_states, cos, sin, section, cache, position):
        seen.append((cache, position))
        return (
            *kernels.attention_prologue_wrapper(attention, norm, hidden_states, cos, sin, section),
            written,
        )

    kernels.attention_prologue_cache_wrapper = attention_prologue_cache_wrapper
    kernels.USE_PTO_ATTENTION_PROLOGUE = True
    monkeypatch.setitem(sys.modules, "pto_kernels", kernels)
    layer, cache = patched.Qwen2_5_VLDecoderLayer(), _CountingCache()
    angles = torch.randn(3, 1, 1, 4).repeat(1, 1, 1, 2)
    with torch.no_grad():
        layer(torch.randn(1, 1, 32), position_embeddings=(angles.cos(), angles.sin()), past_key_values=cache)
    assert seen == [(cache, None)] and cache.updates == (0 if written else 1)
