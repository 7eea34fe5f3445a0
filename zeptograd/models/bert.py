"""A BERT encoder (as HuggingFace's BertModel) and sentence embeddings with mean pooling (as sentence-transformers).

    model = Bert.from_pretrained(model_dir)          # config.json + model.safetensors, loaded with safe_load
    tok = load_tokenizer(model_dir)                  # tokenizer.json through the `tokenizers` library
    ids, mask = tokenize(tok, ["a sentence", ...])   # int32 numpy, padded to a multiple of pad_to
    emb = model.sentence_embeddings(Tensor(ids), Tensor(mask))   # (batch, hidden), L2-normalized

The weights keep HuggingFace's names, so `load_state_dict(model, safe_load(...))` maps them one to one.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np

from zeptograd import Tensor, dtypes, nn
from zeptograd.helpers import ArgumentError
from zeptograd.nn.state import get_state_dict, load_state_dict, safe_load


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    @staticmethod
    def from_json(path: str | os.PathLike) -> BertConfig:
        with open(path) as f:
            raw = json.load(f)
        if raw.get("hidden_act", "gelu") not in ("gelu", "gelu_new"):
            raise ArgumentError(f"{path}: hidden_act {raw['hidden_act']!r} is not supported (gelu or gelu_new)")
        return BertConfig(**{k: raw[k] for k in BertConfig.__dataclass_fields__ if k in raw})


class BertEmbeddings:
    def __init__(self, cfg: BertConfig):
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def __call__(self, input_ids: Tensor, token_type_ids: Tensor | None) -> Tensor:
        seq_len = input_ids.shape[1]
        # the position and token-type tables are sliced, not looked up: rows 0..seq_len-1, and type 0 by default
        pos = self.position_embeddings.weight[:seq_len]
        if token_type_ids is None:
            types = self.token_type_embeddings.weight[0]
        else:
            types = self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(self.word_embeddings(input_ids) + pos + types)


class BertSelfAttention:
    def __init__(self, cfg: BertConfig):
        self.heads, self.head_dim = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def __call__(self, x: Tensor, attn_bias: Tensor) -> Tensor:
        bs, seq_len, hidden = x.shape

        def split_heads(t: Tensor) -> Tensor:
            return t.reshape(bs, seq_len, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = split_heads(self.query(x)), split_heads(self.key(x)), split_heads(self.value(x))
        scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(self.head_dim)) + attn_bias
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(bs, seq_len, hidden)


class BertSelfOutput:
    def __init__(self, cfg: BertConfig, in_size: int):
        self.dense = nn.Linear(in_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def __call__(self, x: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention:
    def __init__(self, cfg: BertConfig):
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg, cfg.hidden_size)

    def __call__(self, x: Tensor, attn_bias: Tensor) -> Tensor:
        return self.output(self.self(x, attn_bias), x)


class BertIntermediate:
    def __init__(self, cfg: BertConfig):
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.approximate = "none" if cfg.hidden_act == "gelu" else "tanh"  # HF: "gelu" is erf's, "gelu_new" tanh's

    def __call__(self, x: Tensor) -> Tensor:
        return self.dense(x).gelu(approximate=self.approximate)


class BertLayer:
    def __init__(self, cfg: BertConfig):
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertSelfOutput(cfg, cfg.intermediate_size)

    def __call__(self, x: Tensor, attn_bias: Tensor) -> Tensor:
        h = self.attention(x, attn_bias)
        return self.output(self.intermediate(h), h)


class BertEncoder:
    def __init__(self, cfg: BertConfig):
        self.layer = [BertLayer(cfg) for _ in range(cfg.num_hidden_layers)]

    def __call__(self, x: Tensor, attn_bias: Tensor) -> Tensor:
        for layer in self.layer:
            x = layer(x, attn_bias)
        return x


class Bert:
    """BertModel without the pooler: input ids (batch, seq) -> last hidden states (batch, seq, hidden)."""

    def __init__(self, cfg: BertConfig):
        self.cfg = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)

    def __call__(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
            raise ArgumentError(
                f"Bert: input_ids {input_ids.shape} must be (batch, seq) and attention_mask the same "
                f"shape, got {attention_mask.shape}"
            )
        if input_ids.shape[1] > self.cfg.max_position_embeddings:
            raise ArgumentError(
                f"Bert: sequence length {input_ids.shape[1]} exceeds max_position_embeddings "
                f"{self.cfg.max_position_embeddings}"
            )
        # padded keys get a large negative score before the softmax (HF uses the dtype's min, the same in float32)
        attn_bias = (attention_mask.reshape(input_ids.shape[0], 1, 1, -1) == 0).where(
            float(np.finfo(np.float32).min), 0.0
        )
        return self.encoder(self.embeddings(input_ids, token_type_ids), attn_bias)

    def sentence_embeddings(self, input_ids: Tensor, attention_mask: Tensor, normalize: bool = True) -> Tensor:
        """Mean of the token states over the attention mask, then L2-normalized (sentence-transformers' pooling)."""
        hidden = self(input_ids, attention_mask)
        mask = attention_mask.cast(dtypes.float32).unsqueeze(-1)
        pooled = (hidden * mask).sum(1) / mask.sum(1).maximum(1e-9)
        return pooled.normalize(p=2, dim=1) if normalize else pooled

    @staticmethod
    def from_pretrained(model_dir: str | os.PathLike) -> Bert:
        """config.json and model.safetensors from a HuggingFace BERT checkpoint folder."""
        model = Bert(BertConfig.from_json(os.path.join(model_dir, "config.json")))
        weights = safe_load(os.path.join(model_dir, "model.safetensors"))
        # checkpoints saved from BertForXxx prefix the names with "bert."; position_ids is a buffer, not a weight
        weights = {k.removeprefix("bert."): v for k, v in weights.items() if not k.endswith("position_ids")}
        load_state_dict(model, weights, strict=False)
        missing = sorted(set(get_state_dict(model)) - set(weights))
        if missing:
            raise ArgumentError(f"{model_dir}: model.safetensors lacks {len(missing)} weights, e.g. {missing[:3]}")
        return model


def load_tokenizer(model_dir: str | os.PathLike, max_length: int = 256):
    """The model's tokenizer.json through the `tokenizers` library, truncating to max_length tokens."""
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        raise ImportError(
            'the BERT tokenizer needs the `tokenizers` package: pip install tokenizers (or pip install -e ".[minilm]")'
        ) from e
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.enable_truncation(max_length)
    tok.no_padding()
    return tok


def tokenize(tok, sentences: list[str], pad_to: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask) as int32 arrays, padded with 0 to the longest sentence rounded up to pad_to.
    Rounding the length up lets batches of similar lengths share one compiled graph (and one TinyJit capture)."""
    if not sentences:
        raise ArgumentError("tokenize: no sentences")
    encodings = tok.encode_batch(list(sentences))
    longest = max(len(e.ids) for e in encodings)
    length = -(-longest // pad_to) * pad_to
    ids = np.zeros((len(encodings), length), dtype=np.int32)
    mask = np.zeros((len(encodings), length), dtype=np.int32)
    for i, e in enumerate(encodings):
        ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.ids)] = e.attention_mask
    return ids, mask
