"""The tiny models' tokenizer: a small byte-level BPE trained offline, carrying Qwen's special tokens in
the order Qwen's vocabulary appends them, and Qwen's chat template (tiny/model.py writes the folder)."""

from __future__ import annotations

from typing import Any

# The Qwen2 special tokens in the order Qwen's vocabulary appends them after the BPE tokens.
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Added as ordinary (non-special) added tokens, as in Qwen's tokenizer.
QWEN_ADDED_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)

# Qwen2's pre-tokenizer split (a fact of its tokenizer.json); transformers 5 rebuilds it too.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)

BPE_MERGES = 96  # learned merges on top of the 256 byte symbols
VOCAB_MULTIPLE = 64  # the embedding is padded past the tokenizer, as Qwen pads 151665 -> 151936

# A few lines of OCR-like text, the BPE training corpus (fixed so the tokenizer is reproducible).
TRAINING_TEXT = """\
Invoice number 2024-0117 dated 12 March 2024. Total amount due: 1,284.50 EUR.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Read the text in the image. Return the text line by line, in reading order.
Name: Ada Lovelace. Address: 12 St James's Square, London. Phone +44 20 7946 0958.
Table 3: results of the evaluation on the test set, with the mean and the standard deviation.
Section 2.1 describes the method; section 4 reports the results and the limitations.
The model reads scanned pages, receipts, forms and handwritten notes and returns plain text.
"""

# No whitespace control needed: the template has no incidental whitespace, only the "\n"s it emits.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' or 'video' in part %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part['text'] }}"
    "{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tokenizer = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = BpeTrainer(
        vocab_size=len(alphabet) + BPE_MERGES,
        initial_alphabet=alphabet,
        show_progress=False,
        special_tokens=[],
    )
    tokenizer.train_from_iterator(TRAINING_TEXT.splitlines(), trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_ADDED_TOKENS])
    return tokenizer


def tokenizer_config(token_ids: dict[str, int], processor_class: str) -> dict[str, Any]:
    added = {}
    for token in QWEN_SPECIAL_TOKENS + QWEN_ADDED_TOKENS:
        added[str(token_ids[token])] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token in QWEN_SPECIAL_TOKENS,
        }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in QWEN_SPECIAL_TOKENS if t != "<|endoftext|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "processor_class": processor_class,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2TokenizerFast",
        "unk_token": None,
    }
