"""Using a trained model (next-token prediction, streamed generation) and the whole pipeline.

`run_pipeline(corpus, run_dir)` runs the stages in order, each skipped when its output in the
run directory is present and up to date:

    1. tokenizer  run_dir/tokenizer.safetensors, trained on the corpus (kept while the corpus,
                  the vocabulary size and the eot token are unchanged; `pipeline.json` records them)
    2. encode     run_dir/tokens.npy, and val_tokens.npy for a validation corpus (`--val`; each
                  kept while its corpus, the tokenizer and the eot token are the same)
    3. train      run_dir/model.safetensors + train_state.safetensors (kept when finished with
                  the same settings and data, resumed when unfinished, retrained when stale)
    4. sample     `predict_next` and `generate` on a prompt taken from the validation text

Deleting a stage's output and rerunning redoes that stage and whatever depends on it.
This module prints nothing; it reports through the `say` callback and return values.
"""

from __future__ import annotations

import codecs
import dataclasses
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tokenkit.bpe import Tokenizer
from tokenkit.bpe.show import token_repr
from tokenkit.pipeline import checkpoint, data, rundir, sources
from tokenkit.pipeline.config import DEFAULT_VOCAB_SIZE, TrainConfig
from tokenkit.pipeline.errors import PipelineError
from tokenkit.pipeline.names import MAX_NEW_TOKENS
from tokenkit.pipeline.ranks import Ranks
from tokenkit.pipeline.resume import resume_training
from tokenkit.pipeline.start import encode_note, fit_tokenizer, refuse_streams_under_mpi, train_model
from tokenkit.pipeline.train import TrainResult
from tokenkit.pipeline.train_memory import check_training_memory
from tokenkit.transformer.backends import as_host


def load_model_and_tokenizer(model_path: str | Path, tokenizer_path: str | Path | None = None, device: str = "cpu"):
    """(GPT, Tokenizer) for inference: the model file's own tokenizer, or the one given.

    A model saved by `GPT.save` carries no tokenizer: then `tokenizer_path` is needed. A given
    tokenizer must have as many tokens as the model's own (`checkpoint.paired_tokenizer`; the
    model's vocabulary may be padded beyond them).
    """
    loaded = checkpoint.load_model(model_path, tokenizer_required=tokenizer_path is None, device=device)
    given = None if tokenizer_path is None else checkpoint.load_tokenizer(tokenizer_path)
    return loaded.model, checkpoint.paired_tokenizer(loaded, given, model_path)


# --- prediction ------------------------------------------------------------------------------


# the special tokens that end a text, most usual first: GPT-2's (and Qwen2's, SmolLM's), Llama 3's,
# the chat models', SentencePiece's
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "</s>")


def eos_id(tokenizer) -> int | None:
    """The id that ends a text: the first of EOS_NAMES the tokenizer has (None when it has none);
    generation stops there, and an export to transformers names it as the eos."""
    return next((tokenizer.special_tokens[s] for s in EOS_NAMES if s in tokenizer.special_tokens), None)


def pad_label(token_id: int) -> str:
    """How an id of a padded vocabulary is shown: one with no token (at or past the tokenizer's
    size), unquoted so that no token's text reads the same.

    >>> pad_label(151700)
    '<pad id 151700>'
    """
    return f"<pad id {int(token_id)}>"


def token_text(tokenizer, token_id: int) -> str:
    """A model id as tables and reports show it: its token quoted (bpe/show.py's `token_repr`,
    part of a character as \\xNN), or `pad_label` for an id with no token."""
    if token_id >= tokenizer.vocab_size:
        return pad_label(token_id)
    return token_repr(tokenizer.decode_bytes([int(token_id)]))


class ModelInput(NamedTuple):
    """What a model reads of a text: `ids` (at most its context), and `cut`, how many of the
    text's tokens before them it does not read (0 when the whole text fits)."""

    ids: list[int]
    cut: int


def fit_context(ids: list[int], context: int, bos: bool, say: Callable[[str], None]) -> ModelInput:
    """The one rule for a text longer than a model's context, in every command and view that runs
    the model forward (predict-next, generate, explain, tk serve's views): it reads the text's last
    `context` tokens, the ones the next token depends on, and `say` is told once in one line
    (`cut_field` puts the count in JSON). A tokenizer's BOS (`bos`: `ids` starts with it) stays
    first: the BOS and the last `context - 1`. Not for `tk chat` (it drops whole turns) or `tk
    eval` (it slides a window over the whole text).

    >>> fit_context([7, 8, 9], 2, False, print)
    warning: the text is 3 tokens, longer than the model's context of 2; using its last 2 (the first 1 dropped)
    ModelInput(ids=[8, 9], cut=1)
    """
    cut = max(0, len(ids) - context)
    if cut:
        kept = f"its BOS and last {context - 1:,}" if bos else f"its last {context:,}"
        first = "the first {:,} after the BOS" if bos else "the first {:,}"
        say(
            f"warning: the text is {len(ids):,} tokens, longer than the model's context of {context:,}; "
            f"using {kept} ({first.format(cut)} dropped)"
        )
        ids = ids[:1] + ids[cut + 1 :] if bos else ids[cut:]
    return ModelInput(ids, cut)


def cut_field(cut: int) -> dict[str, int]:
    """The --json and tk serve field of `fit_context`'s cut, in every document that runs the model
    on a text: {"cut": N} when N tokens were dropped from the text's start, else nothing."""
    return {"cut": cut} if cut else {}


def encode_prompt(
    model,
    tokenizer,
    text: str,
    say: Callable[[str], None],
    *,
    allowed_special: Iterable[str] | str = (),
    disallowed_special: Iterable[str] | str = "all",
) -> ModelInput:
    """Prompt -> the ids the model reads (`fit_context`: the last `context_length` when longer,
    with a warning).

    Special tokens in the prompt follow `Tokenizer.encode`'s policy: by default text that looks
    like one is an error; `allowed_special="all"` reads it as the special token (the model sees
    its id), `disallowed_special=()` as plain text. A tokenizer's BOS (`Tokenizer.bos`) comes
    first, and stays first when the prompt is cut.
    """
    if not text:
        raise PipelineError("the prompt is empty; give some text to continue")
    ids = tokenizer.encode_for_model(text, allowed_special=allowed_special, disallowed_special=disallowed_special)
    return fit_context(ids, model.config.context_length, tokenizer.bos is not None, say)


@dataclass
class Prediction:
    """The next-token distribution after a prompt: `top` holds (id, probability), most likely first."""

    prompt_ids: list[int]
    top: list[tuple[int, float]]
    cut: int = 0  # the prompt's tokens before `prompt_ids` the model did not read (`fit_context`)

    @property
    def argmax(self) -> int:
        return self.top[0][0]


def predict_next(
    model,
    tokenizer,
    text: str,
    *,
    top_k: int = 10,
    allowed_special: Iterable[str] | str = (),
    disallowed_special: Iterable[str] | str = "all",
    say: Callable[[str], None] = lambda m: None,
) -> Prediction:
    """Probabilities of the token after `text` (softmax of the last position's logits); special
    tokens in `text` as `encode_prompt` reads them."""
    if top_k < 1:
        raise PipelineError(f"--top-k must be at least 1, got {top_k}")
    ids, cut = encode_prompt(
        model, tokenizer, text, say, allowed_special=allowed_special, disallowed_special=disallowed_special
    )
    with np.errstate(over="ignore", invalid="ignore"):  # weights too large for float32: said below in one line
        logits = as_host(model.forward(np.asarray(ids, dtype=np.int64)[None, :])[0, -1]).astype(np.float64)  # (V,)
    if not np.isfinite(logits).all():
        raise PipelineError(
            "the model's scores for this prompt overflow float32 (infinite or NaN): its weights are damaged "
            "or its training diverged"
        )
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")[: min(top_k, len(probs))]  # ties: the smaller id first
    return Prediction(prompt_ids=ids, top=[(int(i), float(probs[i])) for i in order], cut=cut)


def generate_ids(
    model,
    tokenizer,
    prompt: str,
    *,
    max_new_tokens: int = 100,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    allowed_special: Iterable[str] | str = (),
    disallowed_special: Iterable[str] | str = "all",
    say: Callable[[str], None] = lambda m: None,
    observe: Callable[[np.ndarray, np.ndarray], None] | None = None,
) -> tuple[ModelInput, Iterator[int]]:
    """(what the model reads of the prompt (`fit_context`), an iterator of the new token ids): what
    `generate` decodes, checked before the first token. `observe(logits, probs)` sees each step's
    distribution (`GPT.generate`). An id with no token (a vocabulary padded beyond the tokenizer's)
    is never picked: transformers' `generate` could pick one, and no tokenizer decodes it;
    everywhere else the model is as it is. The iterator may warn (the model's own warning when the
    window shifts); `generate` says it once before the text starts instead."""
    if max_new_tokens < 0:
        raise PipelineError(f"--max-new-tokens must not be negative, got {max_new_tokens}")
    if max_new_tokens > MAX_NEW_TOKENS:
        raise PipelineError(f"--max-new-tokens must be at most {MAX_NEW_TOKENS:,}, got {max_new_tokens}")
    read = encode_prompt(
        model, tokenizer, prompt, say, allowed_special=allowed_special, disallowed_special=disallowed_special
    )
    ids = read.ids
    tokens = model.generate(
        np.asarray(ids, dtype=np.int64),
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop_token=eos_id(tokenizer),
        use_cache=True,
        observe=observe,
        n_tokens=tokenizer.vocab_size if tokenizer.vocab_size < model.config.vocab_size else None,
    )
    limit = model.config.context_length
    if len(ids) + max_new_tokens > limit:
        say(
            f"note: prompt ({len(ids)} tokens) + {max_new_tokens} new tokens exceed the model's context ({limit}); "
            f"when the window is full it keeps its last {limit // 2} tokens and grows again"
        )
    return read, _quietly(tokens)


def _quietly(tokens: Iterator[int]) -> Iterator[int]:
    """`tokens` without the model's warning: the caller said it once, before the text starts; the
    model's own would land mid-stream."""
    while True:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            token_id = next(tokens, None)
        if token_id is None:
            return
        yield int(token_id)


def generate(model, tokenizer, prompt: str, **options) -> Iterator[str]:
    """Yield the continuation of `prompt` as text pieces, as the tokens come (KV-cached decoding);
    `options` are `generate_ids`'s (max_new_tokens, temperature, top_k, top_p, seed, the special
    tokens' policy, say).

    A token may end in the middle of a UTF-8 character; its bytes are held by an incremental
    decoder until the character completes, so every yielded piece is whole characters. Special
    tokens in `prompt` as `encode_prompt` reads them.
    """
    _, tokens = generate_ids(model, tokenizer, prompt, **options)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for token_id in tokens:
        piece = decoder.decode(tokenizer.decode_bytes([token_id]))
        if piece:
            yield piece
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


def sample_prompt(tokens: np.ndarray, tokenizer, n_words: int = 10) -> str:
    """The opening words of the first paragraph of the validation text: unseen, but in the corpus's style."""
    text = tokenizer.decode(np.asarray(tokens[:4096]).tolist())
    start = text.find("\n\n")
    para = text[start + 2 :] if start >= 0 else text
    words = para.split()
    if not words:
        words = text.split()
    return " ".join(words[:n_words]) if words else text[:20]


# --- the whole pipeline ----------------------------------------------------------------------


@dataclass
class PipelineResult:
    """What each stage did, and where the model is."""

    run_dir: Path
    stages: dict[str, str]
    train: TrainResult | None
    prompt: str


def _tokenizer_stage(corpus: sources.RunCorpus, run_dir: Path, vocab_size: int, quiet: bool, say, before_training):
    """(tokenizer, "reused" | "trained", the pipeline.json stamp to write when the run starts).

    The tokenizer is trained on the training inputs alone (never on a --val corpus); a v1
    stamp's `corpus_sha256` is its corpus fingerprint, and it had no special tokens.
    `before_training()` runs first when it must be trained: it may refuse (a directory holding
    another run's tokenizer, or a damaged pipeline.json) before minutes of work."""
    tok_path = run_dir / checkpoint.TOKENIZER_FILE
    stamp = checkpoint.read_json(run_dir / checkpoint.PIPELINE_FILE)
    stamp = stamp if isinstance(stamp, dict) else {}
    specials = [corpus.spec.eot] if corpus.spec.eot is not None else []
    same = (
        data.record_key(stamp)["corpus_fingerprint"] == corpus.fingerprint()
        and stamp.get("vocab_size") == vocab_size
        and stamp.get("special_tokens", []) == specials
    )
    if tok_path.exists() and same:
        tok = Tokenizer.load(tok_path)
        if tok.fingerprint() == stamp.get("tokenizer_fingerprint"):
            say(f"tokenizer: up to date ({tok_path}, vocab {tok.vocab_size})")
            return tok, "reused", None
    before_training()
    say(f"tokenizer: training BPE on {corpus.spec.describe()} (vocab {vocab_size})")
    tok = fit_tokenizer(corpus, vocab_size, quiet=quiet)
    new_stamp = {
        "corpus": {"inputs": list(corpus.spec.inputs), **corpus.spec.reading()},
        "corpus_fingerprint": corpus.fingerprint(),
        "vocab_size": vocab_size,
        "special_tokens": specials,
        "tokenizer_fingerprint": tok.fingerprint(),
    }
    return tok, "trained", new_stamp


def _save_tokenizer(run_dir: Path, into: Path, tok, stamp: dict[str, Any], say) -> None:
    """The trained tokenizer and its stamp, written into `into`: the run directory, or the new
    run's staging inside it (`rundir.NewRun`)."""
    tok.save(into / checkpoint.TOKENIZER_FILE)
    report = getattr(tok, "train_report", None)
    detail = f", {report.merges_learned} merges, {report.seconds:.1f} s" if report is not None else ""
    say(f"tokenizer: saved {run_dir / checkpoint.TOKENIZER_FILE} (vocab {tok.vocab_size}{detail})")
    checkpoint.write_json(into / checkpoint.PIPELINE_FILE, stamp)


def run_pipeline(
    corpus,
    run_dir: str | Path,
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    config: TrainConfig | None = None,
    overwrite: bool = False,
    ranks: Ranks | None = None,
    device: str = "cpu",
    quiet: bool = False,
    say: Callable[[str], None] = lambda m: None,
) -> PipelineResult:
    """Stages 1-3 (tokenizer, encode, train), each skipped or resumed when its output is current.

    `corpus`: a path, a list of paths, a `sources.CorpusSpec` (directories, compressed files,
    JSONL, an eot token, a validation corpus) or one already opened (`sources.RunCorpus`). Stdin
    ("-") and pipes are copied into the run directory once it is locked (`sources.store_streams`),
    and the stages read that copy; a copy with the contents already there leaves the stages up to
    date. The run directory is locked for the whole call. A stage whose output exists but is stale
    (a new corpus, --val, --eot or special-token policy, vocabulary size or training settings) is
    redone only with `overwrite`; without it the call stops in one line before touching anything,
    as it does for a directory holding files not made by the pipeline. New outputs are committed
    only once training is known to start. Returns where things are and a prompt from the validation
    text for stage 4 (`predict_next` and `generate` on `checkpoint.load_model(run_dir)`), which the
    caller runs so it can stream. `ranks`: this is rank 0 of an MPI job; the other ranks join the
    training stage (`pipeline.join.follow`), the others are rank 0's alone.
    """
    corpus = sources.open_corpus(corpus, warn=lambda msg: say(f"warning: {msg}"))
    refuse_streams_under_mpi(corpus.spec, ranks)
    config = config or TrainConfig()
    check_training_memory(config, vocab_size, ranks, device)
    with rundir.RunDir(run_dir) as rd:
        run_dir = rd.path
        road = rd.present(rundir.CHAT_ROAD_FILES)
        if road:  # even with --overwrite: its runs are in subdirectories, which this run would not replace
            raise PipelineError(
                f"{run_dir} holds `tk pipeline --chat`'s files ({', '.join(road)}); run tk pipeline --chat "
                "there, or choose another -o"
            )
        if not overwrite and not (run_dir / checkpoint.PIPELINE_FILE).exists():
            rundir.refuse_conflicts(run_dir, rd.present(), what="a run not made by `tk pipeline`")
        corpus = sources.store_streams(corpus, run_dir, say)  # validated and locked: now a stream may be read
        stages: dict[str, str] = {}
        try:
            corpus.val_fingerprint()  # a malformed --val stops the run here, before any training

            def refuse_another_tokenizer() -> None:
                if not overwrite:
                    rundir.refuse_conflicts(
                        run_dir,
                        rd.present([checkpoint.TOKENIZER_FILE]),
                        what="a tokenizer trained on another corpus or vocabulary size",
                    )

            tok, stages["tokenizer"], stamp = _tokenizer_stage(
                corpus, run_dir, vocab_size, quiet, say, refuse_another_tokenizer
            )
            tokens = data.prepare_tokens(corpus, tok, run_dir, quiet=quiet, commit=False)
        finally:
            corpus.discard()  # copies of streams are still the corpus's only when this failed (the tokens took them)
        stages["encode"] = "reused" if tokens.reused else "encoded"
        try:
            stages["train"], result = _train_stage(
                corpus, rd, tok, tokens, stamp, config, overwrite, ranks, device, quiet, say
            )
        finally:
            tokens.discard()  # still pending only when the run did not start
        _, val = tokens.split(config.val_fraction, config.context_length)
        return PipelineResult(run_dir=run_dir, stages=stages, train=result, prompt=sample_prompt(val, tok))


def _train_stage(
    corpus,
    rd: rundir.RunDir,
    tok,
    tokens: data.TokenData,
    stamp,
    config: TrainConfig,
    overwrite: bool,
    ranks: Ranks | None,
    device: str,
    quiet,
    say,
):
    run_dir = rd.path
    state_path = run_dir / checkpoint.STATE_FILE
    why = None
    if state_path.exists():
        try:
            meta = checkpoint.read_header(state_path)
            recorded_config = TrainConfig.from_dict(_json(meta.get("train_config")))
            if config.workers == 0:  # "one per core": whatever count the run recorded
                recorded_config = dataclasses.replace(recorded_config, workers=0)
            same_config = recorded_config == config
            recorded = _json(meta.get("data"))
            same_data = data.same_ids(data.record_key(recorded), tokens.key())
            step = int(meta.get("step", -1))
        except (PipelineError, ValueError, TypeError):
            same_config = same_data = False
            step = -1
        current = stamp is None and same_config and same_data
        if current and (run_dir / checkpoint.MODEL_FILE).exists() and step == config.steps:
            data.commit_tokens(tokens, run_dir)
            say(encode_note(tokens, run_dir))
            say(f"train: up to date ({run_dir / checkpoint.MODEL_FILE}, step {step})")
            return "reused", None
        if current and 0 <= step < config.steps:
            data.commit_tokens(tokens, run_dir)
            say(encode_note(tokens, run_dir))
            return "resumed", resume_training(run_dir, corpus=corpus, ranks=ranks, device=device, quiet=quiet, say=say)
        why = (
            "the corpus, --val, --eot, --allow-special/--specials-as-text or tokenizer changed"
            if not (stamp is None and same_data)
            else "the training settings changed"
        )
    elif (run_dir / checkpoint.MODEL_FILE).exists():
        why = f"{checkpoint.MODEL_FILE} has no {checkpoint.STATE_FILE} beside it to check it against"
    if why is not None and not overwrite:
        raise PipelineError(
            f"{run_dir} holds a model that is not up to date ({why}); pass --overwrite to train it again, "
            "or choose another -o"
        )
    if why is not None:
        say(f"train: {why} since the last run; training from scratch (--overwrite)")

    def start(into: Path) -> None:
        if stamp is not None:
            _save_tokenizer(run_dir, into, tok, stamp, say)

    result = train_model(
        corpus,
        run_dir,
        tok,
        config,
        overwrite=True,
        tokens=tokens,
        on_start=start,
        ranks=ranks,
        device=device,
        quiet=quiet,
        say=say,
    )
    return "trained", result


def _json(value: str | None) -> Mapping[str, Any]:
    parsed = checkpoint.loads(value, "training state metadata") if value else {}
    if not isinstance(parsed, dict):
        raise ValueError("not a JSON object")
    return parsed
