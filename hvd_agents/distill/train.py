"""Training the draft head by distillation from the target (``hvd-agents train-drafter``).

Recipe:

1. **Data** (:mod:`hvd_agents.distill.data`): the target's answers to
   templated chat prompts (:mod:`hvd_agents.distill.prompts`), greedy and
   sampled, and its teacher-forced hidden states. A held-out share of the
   sequences (by prompt) measures the head.
2. **Draft vocabulary**: the ``V'`` most frequent target tokens in the answers
   (plus the end-of-turn ids); :func:`choose_vocab` reports its coverage.
3. **Loss**, at every answer index ``t`` (predicting ``h_{t+1}`` and token
   ``x_{t+2}``): cross-entropy of the head's draft-vocabulary distribution
   against the target's (its LM rows applied to the true ``h_{t+1}``), plus a
   small smooth-L1 term pulling the predicted feature to ``h_{t+1}``.
4. **Training-time test** (EAGLE-3): the head is also run as it drafts, on its
   own predicted features. Pass ``p`` feeds the previous pass's prediction
   ``h^_t`` at index ``t``; its query attends to the true-feature keys up to
   ``t - p + 1`` and to the predicted-feature keys of passes ``2..p`` at their
   own index (exactly the keys a drafting step sees), so the head learns to
   continue from its own features. Pass ``p`` is weighted ``0.8 ** (p - 1)``.
5. AdamW with warm-up and cosine decay; the final head is the one with the best
   held-out loss.

Measured quality is the per-pass top-1 agreement with the target's greedy
token on the held-out answers (``acc@1`` is the first draft token, ``acc@p``
the p-th, given correct earlier tokens); ``expected_accepted`` chains them.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from hvd_agents.distill.data import Sample
from hvd_agents.draft_head.model import DraftHead, DraftHeadConfig, init_weights, target_signature, with_taps


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of ``train-drafter``."""

    draft_vocab: int = 8192
    intermediate_size: int = 1536
    num_heads: int = 0  # 0: the target's attention heads
    epochs: int = 6
    lr: float = 1e-3
    weight_decay: float = 0.01
    batch_tokens: int = 1024
    ttt_passes: int = 3
    feature_weight: float = 0.1
    held_out: float = 0.1
    seed: int = 0
    taps: tuple[int, ...] = ()  # target layers the head fuses (DraftHeadConfig.taps; an init head gains them)
    fusion_only: bool = False  # train the fusion alone (the init head's other weights kept as they are)

    def __post_init__(self) -> None:
        object.__setattr__(self, "taps", tuple(self.taps))
        if self.fusion_only and not self.taps:
            raise ValueError("training the fusion alone needs the layers it fuses (taps)")


@dataclass
class TrainReport:
    """What training measured (kept in the head file's recipe)."""

    train_sequences: int = 0
    held_out_sequences: int = 0
    train_tokens: int = 0
    vocab_coverage: float = 0.0
    accuracy: list[float] = field(default_factory=list)  # held-out acc@1..acc@P of the best epoch
    by_kind: dict[str, list[float]] = field(default_factory=dict)  # the same per prompt kind
    expected_accepted: float = 0.0
    epochs: list[dict] = field(default_factory=list)
    seconds: float = 0.0


def choose_vocab(samples: Sequence[Sample], size: int, always: Sequence[int], target_vocab: int) -> tuple[torch.Tensor, float]:
    """The ``size`` most frequent answer tokens (``always`` included), sorted; and their coverage of answer tokens."""
    counts: Counter[int] = Counter()
    for sample in samples:
        counts.update(sample.tokens[sample.answer_start :].tolist())
        counts.update(sample.greedy[sample.answer_start - 1 :].tolist())
    size = min(size, target_vocab)
    chosen = [t for t in always if 0 <= t < target_vocab][:size]
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        if token not in chosen:
            chosen.append(token)
    for token in range(target_vocab):  # pad with low ids when the answers use fewer distinct tokens
        if len(chosen) >= size:
            break
        if token not in counts and token not in chosen:
            chosen.append(token)
    vocab = torch.tensor(sorted(chosen))
    total = sum(counts.values())
    covered = sum(counts[t] for t in set(chosen))
    return vocab, covered / max(total, 1)


def train_head(
    target: nn.Module,
    samples: Sequence[Sample],
    config: TrainConfig = TrainConfig(),
    *,
    always_tokens: Sequence[int] = (),
    log: Callable[[str], None] = print,
    init: DraftHead | None = None,
    train_only: Sequence[Sample] = (),
) -> tuple[DraftHead, TrainReport]:
    """Train a draft head for ``target`` on ``samples`` (see the module docstring).

    Args:
        init: a head for ``target`` to start from (its weights, shape and draft vocabulary; attached to
            ``target``); None starts from :func:`~hvd_agents.draft_head.model.init_weights` with the
            most frequent answer tokens as the draft vocabulary.
        train_only: more sequences for the training split, never held out (earlier runs' data, which a head
            this one starts from may have trained on: the held-out figures stay on ``samples``' split).

    Raises:
        ValueError: ``init`` was trained for another target, or ``config.fusion_only`` without ``init``.
    """
    start = time.perf_counter()
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    order = list(range(len(samples)))
    rng.shuffle(order)
    n_held = max(1, int(len(samples) * config.held_out)) if len(samples) > 1 else 0
    held = [samples[i] for i in order[:n_held]]
    train = ([samples[i] for i in order[n_held:]] or held) + list(train_only)
    target_vocab = int(target.get_output_embeddings().weight.shape[0])
    if init is not None:
        head, vocab, coverage = _start_from(with_taps(init, config.taps) if config.taps else init, target, train)
    elif config.fusion_only:
        raise ValueError("training the fusion alone needs a trained head to add it to (init)")
    else:
        head, vocab, coverage = _new_head(target, train, config, always_tokens)
    head.attach(target)  # trains in the target's dtype (fp32 on CPU)
    head.train()
    report = TrainReport(len(train), len(held), sum(len(s) - s.answer_start for s in train), coverage)
    log(f"draft vocabulary {len(vocab)} tokens covers {coverage:.1%} of answer tokens; "
        f"{report.train_tokens} training answer tokens in {len(train)} sequences, {len(held)} held out")
    # the greedy target's token as a draft-vocabulary index (-1 when outside it)
    to_draft = torch.full((target_vocab,), -1, dtype=torch.long)
    to_draft[vocab] = torch.arange(len(vocab))
    if config.fusion_only:  # the rest of the head is kept: no gradient reaches it
        for name, param in head.named_parameters():
            param.requires_grad_(name.startswith(("fuse.", "norm_taps.")))
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    batches_per_epoch = len(_batches(train, config.batch_tokens, rng))
    total_steps = max(1, batches_per_epoch * config.epochs)
    warmup = max(1, total_steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total_steps)))
    )
    best_loss, best_state = float("inf"), None
    for epoch in range(config.epochs):
        head.train()
        losses = []
        for batch in _batches(train, config.batch_tokens, rng):
            loss, _ = _batch_loss(head, batch, config, to_draft)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            losses.append(float(loss.detach()))
        held_loss, accuracy = evaluate(head, held, config, to_draft)
        record = {"epoch": epoch + 1, "train_loss": sum(losses) / max(len(losses), 1), "held_out_loss": held_loss,
                  "accuracy": accuracy, "seconds": time.perf_counter() - start}
        report.epochs.append(record)
        log(f"epoch {epoch + 1}/{config.epochs}: train loss {record['train_loss']:.3f}, held-out loss {held_loss:.3f}, "
            f"acc@1..{len(accuracy)} " + " ".join(f"{a:.3f}" for a in accuracy) + f" ({record['seconds']:.0f} s)")
        if held_loss < best_loss:
            best_loss = held_loss
            best_state = {k: v.detach().clone() for k, v in head.state_dict().items()}
            report.accuracy = accuracy
    if best_state is not None:
        head.load_state_dict(best_state)
    for param in head.parameters():
        param.requires_grad_(True)
    for kind in sorted({s.kind for s in held}):
        report.by_kind[kind] = evaluate(head, [s for s in held if s.kind == kind], config, to_draft)[1]
        log(f"held-out {kind} ({sum(s.kind == kind for s in held)} sequences): acc@1..{config.ttt_passes} "
            + " ".join(f"{a:.3f}" for a in report.by_kind[kind]))
    head.eval()
    report.expected_accepted = expected_accepted(report.accuracy)
    report.seconds = time.perf_counter() - start
    return head, report


def _new_head(target: nn.Module, train: Sequence[Sample], config: TrainConfig,
              always_tokens: Sequence[int]) -> tuple[DraftHead, torch.Tensor, float]:
    """A randomly initialised head for ``target``, its draft vocabulary chosen from ``train``, and its coverage."""
    target_vocab = int(target.get_output_embeddings().weight.shape[0])
    vocab, coverage = choose_vocab(train, config.draft_vocab, always_tokens, target_vocab)
    tcfg = target.config
    head_config = DraftHeadConfig(
        hidden_size=int(tcfg.hidden_size),
        num_heads=config.num_heads or int(tcfg.num_attention_heads),
        intermediate_size=config.intermediate_size,
        draft_vocab_size=len(vocab),
        target_vocab_size=target_vocab,
        rope_theta=float(getattr(tcfg, "rope_theta", None) or (getattr(tcfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)),
        rms_norm_eps=float(getattr(tcfg, "rms_norm_eps", 1e-5)),
        target=target_signature(target),
        taps=config.taps,
    )
    head = init_weights(DraftHead(head_config), seed=config.seed)
    head.draft_vocab = vocab
    with torch.no_grad():  # start the predicted features at the scale of the target's (post-norm) hidden states
        rows = torch.cat([s.hidden[s.answer_start :, : head_config.hidden_size].float() for s in train[:256]])
        head.out_norm.weight.copy_(rows.pow(2).mean(0).sqrt().clamp_min(1e-3))
    return head, vocab, coverage


def _start_from(init: DraftHead, target: nn.Module, train: Sequence[Sample]) -> tuple[DraftHead, torch.Tensor, float]:
    """``init`` to train further, its draft vocabulary, and that vocabulary's coverage of ``train``'s answers."""
    if init.config.target != target_signature(target):
        raise ValueError(f"the initial head was trained for {init.config.target}, the target is {target_signature(target)}")
    vocab = init.draft_vocab.cpu()
    counts: Counter[int] = Counter()
    for sample in train:
        counts.update(sample.tokens[sample.answer_start :].tolist())
    chosen = set(vocab.tolist())
    coverage = sum(c for t, c in counts.items() if t in chosen) / max(sum(counts.values()), 1)
    return init, vocab, coverage


def expected_accepted(accuracy: Sequence[float]) -> float:
    """Expected accepted tokens of a draft whose p-th token is right with ``accuracy[p-1]`` given the earlier ones
    (the last rate repeats beyond the measured passes, up to 8 tokens)."""
    total, survive = 0.0, 1.0
    rates = list(accuracy) + [accuracy[-1]] * (8 - len(accuracy)) if accuracy else []
    for rate in rates[:8]:
        survive *= rate
        total += survive
    return total


@torch.no_grad()
def evaluate(head: DraftHead, samples: Sequence[Sample], config: TrainConfig, to_draft: torch.Tensor) -> tuple[float, list[float]]:
    """Held-out loss and per-pass top-1 agreement with the target's greedy token."""
    head.eval()
    total, weight = 0.0, 0
    hits = [0.0] * config.ttt_passes
    counts = [0] * config.ttt_passes
    for batch in _batches(samples, config.batch_tokens, None):
        loss, stats = _batch_loss(head, batch, config, to_draft)
        total += float(loss) * len(batch)
        weight += len(batch)
        for p, (hit, count) in enumerate(stats):
            hits[p] += hit
            counts[p] += count
    head.train()
    return total / max(weight, 1), [h / max(c, 1) for h, c in zip(hits, counts)]


def _batches(samples: Sequence[Sample], batch_tokens: int, rng: random.Random | None) -> list[list[Sample]]:
    """Length-sorted batches of about ``batch_tokens`` padded tokens, shuffled when ``rng`` is given."""
    ordered = sorted(samples, key=len)
    batches, batch = [], []
    for sample in ordered:
        if batch and (len(batch) + 1) * len(sample) > batch_tokens:
            batches.append(batch)
            batch = []
        batch.append(sample)
    if batch:
        batches.append(batch)
    if rng is not None:
        rng.shuffle(batches)
    return batches


def _batch_loss(
    head: DraftHead, batch: Sequence[Sample], config: TrainConfig, to_draft: torch.Tensor
) -> tuple[torch.Tensor, list[tuple[float, int]]]:
    """Loss of one padded batch over all training-time-test passes, and per-pass (hits, count)."""
    device = head.fc.weight.device
    width = max(len(s) for s in batch)
    length = width - 1  # head indices t = 0 .. T - 2
    tokens = torch.zeros(len(batch), width, dtype=torch.long)
    d = head.config.hidden_size
    hidden = torch.zeros(len(batch), width, head.feature_width, dtype=head.fc.weight.dtype)
    greedy = torch.full((len(batch), width), -1, dtype=torch.long)
    answer = torch.zeros(len(batch), length, dtype=torch.bool)  # index t trains when x_{t+2} is an answer token
    valid = torch.zeros(len(batch), length, dtype=torch.bool)
    for i, s in enumerate(batch):
        n = len(s)
        tokens[i, :n] = s.tokens
        hidden[i, :n] = s.features(head.config.taps).to(hidden.dtype)
        greedy[i, :n] = s.greedy
        valid[i, : n - 1] = True
        answer[i, max(0, s.answer_start - 2) : n - 1] = True
    tokens, hidden, greedy = tokens.to(device), hidden.to(device), greedy.to(device)
    answer, valid = answer.to(device), valid.to(device)
    true_next = hidden[:, 1:, :d]  # [B, L, d]: h_{t+1}
    with torch.no_grad():
        teacher = torch.softmax(head.logits(true_next), dim=-1)  # [B, L, V']
        labels = to_draft.to(device)[greedy[:, 1:].clamp_min(0)]  # [B, L]: the target's greedy x_{t+2} in draft ids
    positions = torch.arange(length, device=device)
    total = torch.zeros((), device=device)
    stats = []
    passes = ttt_forward(head, hidden[:, :length], tokens[:, 1:], valid, config.ttt_passes)
    for p, predicted in enumerate(passes, start=1):
        logits = head.logits(predicted)  # [B, L, V']
        use = answer & valid & (positions >= p - 1)[None]
        log_q = torch.log_softmax(logits, dim=-1)
        ce = -(teacher * log_q).sum(-1)  # [B, L]
        feat = F.smooth_l1_loss(predicted, true_next, reduction="none").mean(-1)  # [B, L]
        count = int(use.sum())
        if count:
            pass_loss = ((ce + config.feature_weight * feat) * use).sum() / count
            total = total + (0.8 ** (p - 1)) * pass_loss
            hit = ((logits.argmax(-1) == labels) & (labels >= 0) & use).sum()
            stats.append((float(hit), count))
        else:
            stats.append((0.0, 0))
    return total, stats


def ttt_forward(
    head: DraftHead, features: torch.Tensor, next_tokens: torch.Tensor, valid: torch.Tensor, passes: int
) -> list[torch.Tensor]:
    """The head's predicted features ``[B, L, d]`` of every training-time-test pass.

    Args:
        features: ``[B, L, d]`` the true ``h_t`` at head index ``t``.
        next_tokens: ``[B, L]`` ``x_{t+1}``.
        valid: ``[B, L]`` False at padding.
        passes: how many passes (1 = plain teacher forcing).

    Pass ``p`` at index ``t`` is what the head computes at its ``p``-th drafting
    step when the last verified index is ``t - p + 1`` (see the module docstring).
    """
    device = features.device
    length = features.shape[1]
    positions = torch.arange(length, device=device)
    scale = 1.0 / math.sqrt(head.head_dim)
    key_ok = valid[:, None, None, :]  # [B, 1, 1, L]
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    outputs = []
    for p in range(1, passes + 1):
        x = head.inputs(features, next_tokens)  # [B, L, d]
        q, k, v = head.project(x, positions)  # [B, H, L, hd]
        if p == 1:
            mask = torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None] & key_ok
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            # index t: true keys j <= t - p + 1, and pass p' keys at t - (p - p') for p' = 2..p
            shifted_k = [_shift(keys[pp - 1], p - pp) for pp in range(2, p)] + [k]
            shifted_v = [_shift(values[pp - 1], p - pp) for pp in range(2, p)] + [v]
            scores = (q @ keys[0].transpose(-1, -2)) * scale  # [B, H, L, L]
            allowed = torch.ones(length, length, dtype=torch.bool, device=device).tril(-(p - 1))
            scores = scores.masked_fill(~(allowed[None, None] & key_ok), float("-inf"))
            diag = torch.stack([(q * sk).sum(-1) * scale for sk in shifted_k], dim=-1)  # [B, H, L, p - 1]
            weights = torch.softmax(torch.cat([scores, diag], dim=-1), dim=-1)
            attended = weights[..., :length] @ values[0]
            for j, sv in enumerate(shifted_v):
                attended = attended + weights[..., length + j, None] * sv
        keys.append(k)
        values.append(v)
        predicted = head.finish(x, attended)  # [B, L, d]: h^_{t+1}
        outputs.append(predicted)
        features = _shift(predicted, 1)  # next pass: index t reads h^_t, predicted at index t - 1
    return outputs


def _shift(x: torch.Tensor, by: int) -> torch.Tensor:
    """``x`` moved ``by`` positions later along the sequence axis (dim -2), zero-filled at the start."""
    if by == 0:
        return x
    pad = torch.zeros_like(x[..., :by, :])
    return torch.cat([pad, x[..., :-by, :]], dim=-2)


def recipe(config: TrainConfig, report: TrainReport, extra: dict | None = None) -> dict:
    """The recipe stored with a trained head."""
    data = {"train": asdict(config), "report": asdict(report)}
    data.update(extra or {})
    return data
