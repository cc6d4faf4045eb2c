"""GTPO's turn-level returns, advantages, token spreading and code-similarity shaping, against values
computed by hand; and the two code embedders (hashing, local sentence model)."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from protege.errors import UserFacingError
from protege.rl.code_similarity import HashingEmbedder, SentenceEmbedder, make_embedder
from protege.rl.gtpo import (add_final_turn_bonus, discounted_returns, similarity_shaping, token_advantages,
                             turn_advantages)

PAD = 9.0  # garbage on padded turns: every function must ignore it

# episode 0: three turns (no reward, tool-error penalty, correct); episode 1: one turn
REWARDS = torch.tensor([[0.0, -0.2, 1.0], [0.5, PAD, PAD]], dtype=torch.float64)
VALID = torch.tensor([[True, True, True], [True, False, False]])


# ---------------------------------------------------------------- discounted returns

def test_returns_gamma_0_9_by_hand():
    # R_02 = 1; R_01 = -0.2 + 0.9 * 1 = 0.7; R_00 = 0 + 0.9 * 0.7 = 0.63; padding -> 0
    R = discounted_returns(REWARDS, VALID, 0.9)
    assert torch.allclose(R, torch.tensor([[0.63, 0.7, 1.0], [0.5, 0.0, 0.0]], dtype=torch.float64))


def test_returns_gamma_0_is_the_turn_reward():
    R = discounted_returns(REWARDS, VALID, 0.0)
    assert torch.equal(R, torch.tensor([[0.0, -0.2, 1.0], [0.5, 0.0, 0.0]], dtype=torch.float64))


def test_returns_gamma_1_is_the_undiscounted_rest():
    # 0 - 0.2 + 1 = 0.8; -0.2 + 1 = 0.8; 1
    R = discounted_returns(REWARDS, VALID, 1.0)
    assert torch.allclose(R, torch.tensor([[0.8, 0.8, 1.0], [0.5, 0.0, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("gamma", [-0.1, 1.5, float("nan"), "0.9"])
def test_returns_reject_gamma_outside_0_1(gamma):
    with pytest.raises(ValueError, match="gamma"):
        discounted_returns(REWARDS, VALID, gamma)


# ---------------------------------------------------------------- turn advantages

# G = 2: group 0 = episodes 0, 1; group 1 = episodes 2, 3
RETURNS = torch.tensor([[1.0, 2.0, 3.0],
                        [2.0, PAD, PAD],
                        [4.0, 0.0, PAD],
                        [2.0, PAD, PAD]], dtype=torch.float64)
RVALID = torch.tensor([[True, True, True], [True, False, False], [True, True, False], [True, False, False]])


def test_group_scope_by_hand():
    A = turn_advantages(RETURNS, RVALID, group_size=2, scope="group")
    # group 0: {1, 2, 3, 2}: mean 2, squared deviations 1+0+1+0 = 2, unbiased var 2/3
    s0 = math.sqrt(2 / 3) + 1e-4
    # group 1: {4, 0, 2}: mean 2, squared deviations 4+4+0 = 8, unbiased var 4, std 2
    s1 = 2.0 + 1e-4
    want = torch.tensor([[-1 / s0, 0.0, 1 / s0],
                         [0.0, 0.0, 0.0],
                         [2 / s1, -2 / s1, 0.0],
                         [0.0, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(A, want, atol=1e-12)


def test_turn_scope_by_hand():
    A = turn_advantages(RETURNS, RVALID, group_size=2, scope="turn")
    # group 0: turn 0 {1, 2}: mean 1.5, var (0.25+0.25)/1 = 0.5; turns 1 and 2 have one entry each -> 0
    s0 = math.sqrt(0.5) + 1e-4
    # group 1: turn 0 {4, 2}: mean 3, var (1+1)/1 = 2; turn 1 one entry -> 0
    s1 = math.sqrt(2.0) + 1e-4
    want = torch.tensor([[-0.5 / s0, 0.0, 0.0],
                         [0.5 / s0, 0.0, 0.0],
                         [1 / s1, 0.0, 0.0],
                         [-1 / s1, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(A, want, atol=1e-12)


def test_equal_successes_push_first_turns_down_unless_scope_is_turn():
    # a group of two identical successes: reward 1 on the final turn, gamma 0.9 -> returns [0.9, 1.0] each
    R = torch.tensor([[0.9, 1.0], [0.9, 1.0]], dtype=torch.float64)
    v = torch.ones(2, 2, dtype=torch.bool)
    assert (turn_advantages(R, v, group_size=2, scope="group")[:, 0] < 0).all()
    assert torch.equal(turn_advantages(R, v, group_size=2, scope="turn"), torch.zeros(2, 2, dtype=torch.float64))


def test_batch_scope_by_hand():
    A = turn_advantages(RETURNS, RVALID, group_size=2, scope="batch")
    # all 7 valid returns {1,2,3,2,4,0,2}: mean 14/7 = 2; squared deviations 1+0+1+0+4+4+0 = 10; var 10/6
    s = math.sqrt(10 / 6) + 1e-4
    want = torch.tensor([[-1 / s, 0.0, 1 / s], [0.0, 0.0, 0.0], [2 / s, -2 / s, 0.0], [0.0, 0.0, 0.0]],
                        dtype=torch.float64)
    assert torch.allclose(A, want, atol=1e-12)


def test_centring_only_without_std():
    A = turn_advantages(RETURNS, RVALID, group_size=2, scope="group", scale_by_std=False)
    want = torch.tensor([[-1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [2.0, -2.0, 0.0], [0.0, 0.0, 0.0]],
                        dtype=torch.float64)
    assert torch.equal(A, want)


def test_custom_eps():
    A = turn_advantages(RETURNS, RVALID, group_size=2, scope="group", eps=0.0)
    assert A[2, 0].item() == pytest.approx(1.0)  # 2 / 2


def test_single_entry_group_and_flat_group_give_zero():
    R = torch.tensor([[7.0, PAD], [3.0, 4.0], [5.0, 5.0]], dtype=torch.float64)
    v = torch.tensor([[True, False], [True, True], [True, True]])
    A = turn_advantages(R, v, group_size=1, scope="group")
    # episode 0 alone: no std, centred to 0; episode 1: {3, 4}, mean 3.5, std sqrt(0.5); episode 2 flat
    s = math.sqrt(0.5) + 1e-4
    assert torch.allclose(A, torch.tensor([[0.0, 0.0], [-0.5 / s, 0.5 / s], [0.0, 0.0]], dtype=torch.float64))
    empty = turn_advantages(R, torch.zeros_like(v), group_size=1, scope="batch")
    assert torch.equal(empty, torch.zeros_like(R))  # no valid turn at all: zeros, not NaN


def test_turn_advantages_input_errors():
    with pytest.raises(ValueError, match="scope"):
        turn_advantages(RETURNS, RVALID, group_size=2, scope="episode")
    with pytest.raises(ValueError, match="groups of 3"):
        turn_advantages(RETURNS, RVALID, group_size=3, scope="group")


def test_returns_then_group_advantages_end_to_end():
    R = discounted_returns(REWARDS, VALID, 0.9)  # {0.63, 0.7, 1.0, 0.5}
    A = turn_advantages(R, VALID, group_size=2, scope="group")
    # mean 2.83 / 4 = 0.7075; deviations -0.0775, -0.0075, 0.2925, -0.2075
    dev = [-0.0775, -0.0075, 0.2925, -0.2075]
    s = math.sqrt(sum(d * d for d in dev) / 3) + 1e-4
    want = torch.tensor([[dev[0] / s, dev[1] / s, dev[2] / s], [dev[3] / s, 0.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(A, want, atol=1e-12)


# ---------------------------------------------------------------- token advantages

ADV = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])


def test_token_advantages_whole_episode_rows():
    owner = torch.tensor([0, 1])
    # row 0: obs0 | policy turn 0 | obs1 | policy turn 1 | obs2 | policy turn 2 | pad
    turn = torch.tensor([[0, 0, 0, 1, 1, 2, 2, -1],
                         [0, 0, 1, 1, -1, -1, -1, -1]])
    mask = torch.tensor([[0, 1, 1, 0, 1, 0, 1, 0],
                         [0, 1, 0, 1, 0, 0, 0, 0]])
    out = token_advantages(ADV, owner, turn, mask)
    assert torch.allclose(out, torch.tensor([[0.0, 0.1, 0.1, 0.0, 0.2, 0.0, 0.3, 0.0],
                                             [0.0, 0.4, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0]]))


def test_token_advantages_one_turn_per_row():
    owner = torch.tensor([0, 0, 0, 1])
    turn = torch.tensor([[0, 0, 0, -1], [1, 1, 1, 1], [2, 2, -1, -1], [0, 0, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1], [0, 1, 0, 0], [1, 1, 1, 0]])
    out = token_advantages(ADV, owner, turn, mask)
    assert torch.allclose(out, torch.tensor([[0.0, 0.1, 0.1, 0.0],
                                             [0.0, 0.0, 0.2, 0.2],
                                             [0.0, 0.3, 0.0, 0.0],
                                             [0.4, 0.4, 0.4, 0.0]]))


def test_token_advantages_reject_policy_token_without_turn():
    with pytest.raises(ValueError, match="turn -1"):
        token_advantages(ADV, torch.tensor([0]), torch.tensor([[0, -1]]), torch.tensor([[1, 1]]))
    with pytest.raises(ValueError, match="Tmax"):
        token_advantages(ADV, torch.tensor([0]), torch.tensor([[0, 3]]), torch.tensor([[1, 1]]))


# ---------------------------------------------------------------- similarity shaping

VECS = {"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [1.0, 1.0], "d": [3.0, 4.0]}  # not unit: normalised inside


def lookup_embed(calls=None):
    def embed(texts):
        if calls is not None:
            calls.append(list(texts))
        return torch.tensor([VECS[t] for t in texts])
    return embed


def test_shaping_by_hand():
    codes = ["a", "b", "d", "c", "a", ""]
    success = [True, True, False, False, True, False]
    calls = []
    bonus = similarity_shaping(codes, success, group_size=3, alpha=0.5, embed=lookup_embed(calls))
    # ep2 "d" = (0.6, 0.8): cos with a = 0.6, with b = 0.8 -> 0.5 * 0.7 = 0.35
    # ep3 "c": cos with a = 1/sqrt(2) -> 0.5 / sqrt(2); ep5 failed without code -> 0; successes -> 0
    assert torch.allclose(bonus, torch.tensor([0.0, 0.0, 0.35, 0.5 / math.sqrt(2), 0.0, 0.0]))
    assert len(calls) == 1 and sorted(calls[0]) == ["a", "a", "b", "c", "d"]  # the empty code is not embedded


def test_shaping_accepts_tensor_success():
    bonus = similarity_shaping(["a", "d"], torch.tensor([True, False]), 2, 1.0, lookup_embed())
    assert torch.allclose(bonus, torch.tensor([0.0, 0.6]))


def test_shaping_group_without_success_gets_nothing():
    def never(texts):
        raise AssertionError("nothing to compare: embed must not be called")
    bonus = similarity_shaping(["a", "b", "c", "d"], [False] * 4, 2, 0.5, never)
    assert torch.equal(bonus, torch.zeros(4))
    # a group with a success next to one without: only the first is shaped
    bonus = similarity_shaping(["a", "d", "a", "d"], [True, False, False, False], 2, 0.5, lookup_embed())
    assert torch.allclose(bonus, torch.tensor([0.0, 0.3, 0.0, 0.0]))


def test_shaping_success_without_code_is_no_reference():
    bonus = similarity_shaping(["", "a", "d"], [True, True, False], 3, 0.5, lookup_embed())
    assert torch.allclose(bonus, torch.tensor([0.0, 0.0, 0.3]))  # 0.5 * cos(d, a), not halved by the ""
    bonus = similarity_shaping(["", "d"], [True, False], 2, 0.5, lookup_embed())
    assert torch.equal(bonus, torch.zeros(2))


@pytest.mark.parametrize("alpha", [-0.1, float("nan"), float("inf")])
def test_shaping_rejects_bad_alpha(alpha):
    with pytest.raises(ValueError, match="alpha"):
        similarity_shaping(["a", "d"], [True, False], 2, alpha, lookup_embed())


def test_shaping_input_errors():
    with pytest.raises(ValueError, match="success"):
        similarity_shaping(["a", "d"], [True], 2, 0.5, lookup_embed())
    with pytest.raises(ValueError, match="groups of 2"):
        similarity_shaping(["a", "d", "a"], [True, False, True], 2, 0.5, lookup_embed())
    assert torch.equal(similarity_shaping(["a", "d"], [True, False], 2, 0.0, lookup_embed()), torch.zeros(2))


def test_final_turn_bonus_then_returns():
    rewards = REWARDS.clone()
    out = add_final_turn_bonus(rewards, VALID, torch.tensor([0.35, 0.1]))
    assert torch.allclose(out, torch.tensor([[0.0, -0.2, 1.35], [0.6, PAD, PAD]], dtype=torch.float64))
    assert torch.equal(rewards, REWARDS)  # inputs untouched
    # the bonus discounts back like correctness: R_01 = -0.2 + 0.9 * 1.35 = 1.015, R_00 = 0.9 * 1.015
    R = discounted_returns(out, VALID, 0.9)
    assert torch.allclose(R, torch.tensor([[0.9135, 1.015, 1.35], [0.6, 0.0, 0.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="no valid turn"):
        add_final_turn_bonus(torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.bool), torch.tensor([0.5]))
    kept = add_final_turn_bonus(torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.bool), torch.tensor([0.0]))
    assert torch.equal(kept, torch.zeros(1, 2))


# ---------------------------------------------------------------- hashing embedder

ADD = "def add(a, b):\n    return a + b\n"
ADD2 = "def add(x, y):\n    return x + y\n"
OTHER = "import os\nfor name in sorted(os.listdir('.')):\n    print(name.upper())\n"


def test_hashing_shape_norm_and_empty_text():
    e = HashingEmbedder()([ADD, OTHER, ""])
    assert e.shape == (3, 4096) and e.dtype == torch.float32
    assert torch.allclose(e[:2].norm(dim=1), torch.ones(2))
    assert torch.equal(e[2], torch.zeros(4096))  # no features: the zero row, cosine 0 with anything


def test_hashing_sublinear_tf_by_hand():
    emb = HashingEmbedder(dim=2 ** 20, ngram=(1, 1), tokens=False)
    v = emb(["aab"])[0]
    # unigrams a x2, b x1 -> weights 1 + ln 2 and 1, then L2-normalised (assumes no bucket collision)
    nz = sorted(v[v != 0].tolist())
    n = math.sqrt((1 + math.log(2)) ** 2 + 1)
    assert nz == pytest.approx([1 / n, (1 + math.log(2)) / n], rel=1e-6)


def test_hashing_similar_code_is_closer_than_unrelated_code():
    e = HashingEmbedder()([ADD, ADD2, OTHER, "def add(a,  b):\n  return a  +  b"])
    cos = e @ e.T
    assert cos[0, 1] > cos[0, 2] + 0.2
    # whitespace runs collapse to one space: a reindented copy is the same code
    assert cos[0, 3].item() == pytest.approx(1.0, abs=1e-6)


def test_hashing_is_deterministic_across_processes():
    script = ("import json, sys; from protege.rl.code_similarity import HashingEmbedder; "
              "v = HashingEmbedder()([sys.argv[1]])[0]; "
              "print(json.dumps({i: v[i].item() for i in v.nonzero().flatten().tolist()}))")
    here = HashingEmbedder()([ADD])[0]
    for seed in ("1", "2"):  # different hash() salts: the vector must not depend on them
        res = subprocess.run([sys.executable, "-c", script, ADD], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        there = {int(k): val for k, val in json.loads(res.stdout).items()}
        assert there == {i: here[i].item() for i in here.nonzero().flatten().tolist()}


def test_hashing_bad_arguments():
    with pytest.raises(ValueError, match="dim"):
        HashingEmbedder(dim=0)
    with pytest.raises(ValueError, match="ngram"):
        HashingEmbedder(ngram=(4, 2))


def test_shaping_with_hashing_embedder():
    bonus = similarity_shaping([ADD, ADD, OTHER], [True, False, False], 3, 0.5, HashingEmbedder())
    assert bonus[0] == 0 and bonus[1].item() == pytest.approx(0.5)  # same code: cosine 1
    assert 0 <= bonus[2].item() < 0.5


# ---------------------------------------------------------------- sentence embedder

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "def", "add", "return", "a", "b", "x", "y", "+", "(",
         ")", ":", ",", "import", "os", "print"]


@pytest.fixture(scope="module")
def tiny_sentence_model(tmp_path_factory):
    """A 1-layer BERT with a 20-word vocabulary, saved as a local model folder (safetensors)."""
    from transformers import BertConfig, BertModel, BertTokenizer

    folder = tmp_path_factory.mktemp("sentence_model")
    # transformers 5: BertTokenizer is the tokenizers-backed class (BertTokenizerFast is an alias of it)
    tok = BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)})
    cfg = BertConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=64)
    torch.manual_seed(0)
    BertModel(cfg).save_pretrained(folder)  # transformers 5 always writes safetensors
    tok.save_pretrained(folder)
    assert (folder / "model.safetensors").is_file()
    return folder


def test_sentence_embedder_shape_norm_determinism(tiny_sentence_model):
    emb = SentenceEmbedder(tiny_sentence_model)
    texts = ["def add ( a , b ) : return a + b", "import os", "def add ( a , b ) : return a + b", ""]
    e = emb(texts)
    assert e.shape == (4, 16) and e.dtype == torch.float32
    assert torch.allclose(e.norm(dim=1), torch.ones(4), atol=1e-6)
    assert (e[0] @ e[2]).item() == pytest.approx(1.0, abs=1e-6)  # identical texts
    assert torch.allclose(emb(texts), e)
    assert torch.allclose(SentenceEmbedder(tiny_sentence_model)(texts), e, atol=1e-6)  # a fresh load, too
    # mean pooling ignores padding: a short text alone or padded next to a long one embeds the same
    assert torch.allclose(emb(["import os"])[0], e[1], atol=1e-5)
    assert emb([]).shape == (0, 16)


def test_sentence_embedder_batches(tiny_sentence_model):
    texts = ["def add", "import os", "print ( x )", "return a + b", "a , b"]
    whole = SentenceEmbedder(tiny_sentence_model)(texts)
    assert torch.allclose(SentenceEmbedder(tiny_sentence_model, batch_size=2)(texts), whole, atol=1e-5)


def test_sentence_embedder_missing_path(tmp_path):
    missing = tmp_path / "no_such_model"
    with pytest.raises(UserFacingError, match="no_such_model.*does not exist.*config.json"):
        SentenceEmbedder(missing)
    with pytest.raises(UserFacingError, match="no_such_model"):
        make_embedder(str(missing))


def test_sentence_embedder_refuses_pickle_weights(tmp_path, tiny_sentence_model):
    folder = tmp_path / "pickled"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tiny_sentence_model / name).read_bytes())
    (folder / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(UserFacingError, match=r"pickled.*pickle weights \(pytorch_model.bin\)"):
        SentenceEmbedder(folder)


def test_sentence_embedder_not_a_model_folder(tmp_path, tiny_sentence_model):
    with pytest.raises(UserFacingError, match="missing config.json, \\*.safetensors weights, tokenizer files"):
        SentenceEmbedder(tmp_path)
    (tmp_path / "config.json").write_bytes((tiny_sentence_model / "config.json").read_bytes())
    (tmp_path / "model.safetensors").write_bytes((tiny_sentence_model / "model.safetensors").read_bytes())
    with pytest.raises(UserFacingError, match="missing tokenizer files"):
        SentenceEmbedder(tmp_path)
    a_file = tmp_path / "config.json"
    with pytest.raises(UserFacingError, match="not a folder"):
        SentenceEmbedder(a_file)


def test_make_embedder(tiny_sentence_model):
    assert isinstance(make_embedder(None), HashingEmbedder)
    assert isinstance(make_embedder(""), HashingEmbedder)
    assert isinstance(make_embedder(str(tiny_sentence_model)), SentenceEmbedder)
