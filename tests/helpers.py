"""Test helpers: a real byte-level BPE tokenizer built in-process (no download).

``make_byte_tokenizer()`` returns a ``transformers`` fast tokenizer whose ids 0..255
are the 256 bytes (id == byte value), ids 256, 257, 258 are the special tokens
``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, and ids 259.. are a few merges
(including one spanning a character boundary and one inside a 4-byte character).
Every non-ASCII character spans several tokens, which exercises incremental
detokenization. Its chat template is SmolLM2's ChatML template.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 256, 257, 258

SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Byte-string merges, applied in order: ids 259, 260, ...
MERGES: tuple[tuple[bytes, bytes], ...] = (
    (b"t", b"h"),
    (b" ", b"th"),
    (b"e", b"r"),
    (b"!", b"\xf0"),  # spans a character boundary: "!" + first byte of a 4-byte character
    (b"\x9f", b"\x98"),  # inside a 4-byte character (e.g. the emoji U+1F600..)
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (the ByteLevel alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def make_byte_tokenizer(with_chat_template: bool = True) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer: 256 byte tokens, 3 special tokens, a few merges.

    Args:
        with_chat_template: set ``chat_template`` to SmolLM2's ChatML template.
    """
    byte_map = bytes_to_unicode()
    assert set(byte_map.values()) == set(pre_tokenizers.ByteLevel.alphabet())

    def sym(data: bytes) -> str:
        return "".join(byte_map[b] for b in data)

    vocab = {byte_map[b]: b for b in range(256)}
    for offset, special in enumerate(SPECIAL_TOKENS):
        vocab[special] = 256 + offset
    merges = []
    for left, right in MERGES:
        vocab[sym(left + right)] = len(vocab)
        merges.append((sym(left), sym(right)))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
    )
    if with_chat_template:
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    return tokenizer
