"""How fast `tk serve`'s page answers: server time per request, page update time in a real
browser, and a GPT-2-124M-shaped model explained, side by side with transformers.

    python bench/page.py [--run runs/demo] [--repeats 15] [--no-gpt2] [--no-log]
    python bench/page.py --log-only [--log-steps 1000000]
    python bench/page.py --inside-only [--run runs/demo] [--repeats 15]

1. Server: `tk serve RUN` in a child process; each endpoint asked `--repeats` times for a
   64-token text from the run's corpus (the wall time of one HTTP request from this process,
   so an upper bound on the server's own time). Issue 21's bar: under 50 ms each.
2. Page: headless Chromium (the system's; Playwright drives it) at the page; each interaction
   timed inside the page, from the event (a click, a new text) to body[data-ready="1"] after the
   redraw. A text typed waits for typing to pause (150 ms, core.js) before it asks, so "typed"
   includes that pause; "(redraw)" starts at the change of state. Bar: within 200 ms.
3. GPT-2 124M shapes (random weights, made here like bench/hf_import_memory.py and imported with
   `tk import-hf`; GPT-2's tokenizer from ../shared/data/gpt2): /api/explain and /api/attention on
   64 tokens (/api/attention, one head in full, and /api/thumbnails, every head pooled, asked
   after it as the page asks them, on 512 and 846 tokens, the view's limit, too); the page at the
   attention view of the 846-token text, clicked through
   HEADS_VISITED heads (each click's time to redrawn, and the JS heap after them, garbage
   collected); and, where transformers and torch are installed, the same checkpoint's forward
   with output_attentions=True (what bertviz draws from) on the same ids. Bar: explain within 2 s.
4. Inside the model (issue 33), alone with --inside-only: on GPT-2 124M shapes at 64 tokens, the
   server time of /api/lens, of /api/attribution (the last position's) and of one ablation
   (/api/next?ablate=L.H: two forward passes and the shift), each on a text not asked before
   (the server keeps the last text's trace, which the lens and the attribution share: the
   attribution asked after its text's lens is timed too); and on the run's model, the page's
   ablation click: the switch on, a head's thumbnail (Attention view) or an MLP's block (Model
   view) clicked, from the click to redrawn with the card of the next token before and after,
   each time on a new text (nothing cached). Bars: 2 s each on GPT-2's shapes, 500 ms a click.
5. A long training log (issue 36): a `log.jsonl` of `--log-steps` step records (1M by default,
   an evaluation every 1,000, written as tk writes them) read whole by `pipeline.live.TrainingLog`,
   then 1,000 new lines read incrementally, then /api/training's JSON made from it (the view and
   the server's json.dumps), and the process's peak memory after. The server reads the log under
   a lock of its own, so these times delay /api/training alone. Once each: the first read is
   what it is; the machine's noise is small beside it.

Medians; the machine is noisy. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from tokenkit.pipeline.checkpoint import load_tokenizer  # noqa: E402

GPT2 = REPO.parent / "shared" / "data" / "gpt2"
HEADS_VISITED = 30  # more than the page keeps answers for (core.js CACHE_SIZE)
CHROMIUM = os.environ.get("TK_CHROMIUM", "/usr/bin/chromium")


class Served:
    """`tk serve ARGS --port 0` in a child process, stopped on exit."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tokenkit", "serve", *args, "--port", "0", "--no-browser", "--quiet"],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline().strip()
        if not line.startswith("serving "):
            self.stop()
            raise SystemExit(f"tk serve did not start: {line!r}")
        self.base = line.split(" ", 1)[1]

    def get(self, path: str, **params) -> tuple[float, bytes]:
        url = self.base.rstrip("/") + path + ("?" + urllib.parse.urlencode(params) if params else "")
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=120) as answer:
            body = answer.read()
        return time.perf_counter() - start, body

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def text_of(tokenizer, source: str, n_tokens: int) -> str:
    """The first n_tokens tokens of `source` as text (whole characters), so the text is n_tokens long."""
    ids = tokenizer.encode(source)
    for n in range(n_tokens, 0, -1):
        text = tokenizer.decode(ids[:n])
        if len(tokenizer.encode(text)) == n_tokens:
            return text
    return tokenizer.decode(ids[:n_tokens])


def median_ms(seconds: list[float]) -> float:
    return 1000 * statistics.median(seconds)


def server_times(served: Served, text: str, repeats: int, with_model: bool) -> dict[str, float]:
    asks = {"tokens": ("/api/tokens", {"text": text}), "bpe": ("/api/bpe", {"text": text})}
    if with_model:
        asks |= {
            "attention (one head)": ("/api/attention", {"text": text}),
            "thumbnails (then)": ("/api/thumbnails", {"text": text}),
            "explain, one query": ("/api/explain", {"text": text, "layer": 1, "head": 2, "query": 40}),
            "explain, whole": ("/api/explain", {"text": text, "layer": 1, "head": 2}),
            "next": ("/api/next", {"text": text, "top_k": 10}),
            "generate (20 tokens)": ("/api/generate", {"text": text, "n": 20, "temperature": 1, "seed": 0, "show": 10}),
            "training": ("/api/training", {}),
            "model": ("/api/model", {}),
        }
    out = {}
    for name, (path, params) in asks.items():
        served.get(path, **params)  # a first answer warms caches, as a page's first view does
        out[name] = median_ms([served.get(path, **params)[0] for _ in range(repeats)])
    return out


# Inside the page: do ACT (a JS statement), then wait until the change it starts has been drawn:
# body[data-ready] back to "1" after a redraw, or UNTIL (a JS expression) true for a view that
# updates in place (the BPE slider). Watched by a MutationObserver: no polling interval. The
# page's CSP refuses eval (new Function), so both are spliced into the source here.
_TIMED = """async () => {
  const body = document.body;
  const done = new Promise((resolve) => {
    let started = false;
    const check = () => {
      if (HAS_UNTIL) return UNTIL;
      if (body.dataset.ready === "0") started = true;
      return started && body.dataset.ready === "1";
    };
    const watch = new MutationObserver(() => { if (check()) { watch.disconnect(); resolve(performance.now()); } });
    watch.observe(body, {attributes: true, childList: true, subtree: true});
    setTimeout(() => { watch.disconnect(); resolve(NaN); }, TIMEOUT);
  });
  const t0 = performance.now();
  ACT;
  return (await done) - t0;
}"""


def timed_js(act: str, until: str | None = None, timeout_ms: int = 10_000) -> str:
    """_TIMED with ACT, UNTIL and its timeout spliced in."""
    timed = _TIMED.replace("HAS_UNTIL", "true" if until else "false").replace("TIMEOUT", str(timeout_ms))
    return timed.replace("UNTIL", f"({until})" if until else "false").replace("ACT", act)


_GO = "TK.go({text: %s});"  # the redraw alone: what a typed text starts once typing pauses
_TYPE = "const t = document.getElementById('text'); t.value = %s; t.dispatchEvent(new Event('input'));"


def page_times(base: str, text: str, repeats: int) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    q = urllib.parse.quote(text)
    interactions = {  # name: (address to start from, what to do)
        "tokens: a new text typed": (f"?text={q}", "type"),
        "tokens: a new text (redraw)": (f"?text={q}", "go"),
        "BPE replay: a new text (redraw)": (f"?view=bpe&text={q}", "go"),
        "BPE replay: one step": (
            f"?view=bpe&text={q}&step=3",
            "document.getElementById('bpe-next').click()",
            "document.getElementById('bpe-seq').dataset.step === '4'",
        ),
        "attention: a new text typed": (f"?view=attention&text={q}&query=5", "type"),
        "attention: a new text (redraw)": (f"?view=attention&text={q}&query=5", "go"),
        "attention: another head": (
            f"?view=attention&text={q}&query=5",
            'document.querySelector(\'.thumb[data-layer="1"][data-head="3"]\').click()',
        ),
        "attention: another query": (
            f"?view=attention&text={q}",
            "document.querySelector('.heatmap .cell[data-q=\"9\"]').click()",
        ),
        "next token: a new text (redraw)": (f"?view=next&text={q}", "go"),
        "next token: a new seed": (f"?view=next&text={q}", "document.getElementById('gen-reseed').click()"),
        "tab: training": (f"?text={q}", "document.querySelector('#tabs a[data-view=\"training\"]').click()"),
        "tab: model": (f"?text={q}", "document.querySelector('#tabs a[data-view=\"model\"]').click()"),
    }
    words = text.split()
    out = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        for name, (address, act, *until) in interactions.items():
            times = []
            for i in range(repeats):
                page.goto(base + address)
                page.wait_for_selector('body[data-ready="1"]')
                # each new text differs (no answer comes from the page's cache): the first i words swapped
                new = " ".join(reversed(words[: i + 2])) + " " + " ".join(words[i + 2 :])
                js = {"type": _TYPE % json.dumps(new), "go": _GO % json.dumps(new)}.get(act, act)
                times.append(page.evaluate(timed_js(js, until[0] if until else None)))
            out[name] = statistics.median(times) if all(t == t for t in times) else float("nan")  # NaN: no redraw
        browser.close()
    return out


def page_open_ms(url: str, repeats: int) -> float:
    """Median ms from navigating Chromium to `url` until the page has drawn (each time a fresh load:
    the page's own answer cache starts empty)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            page.goto(url)
            page.wait_for_selector('body[data-ready="1"]', timeout=60_000)
            times.append(time.perf_counter() - start)
        browser.close()
    return median_ms(times)


def page_heads(url: str, heads: list[tuple[int, int]]) -> tuple[float, float]:
    """The page opened at `url` (the attention view), each of `heads` clicked in turn: (median ms
    from the click to redrawn, the page's JS heap in MB after the last, garbage collected)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url)
        page.wait_for_selector('body[data-ready="1"]', timeout=120_000)
        times = []
        for layer, head in heads:
            click = f'document.querySelector(\'.thumb[data-layer="{layer}"][data-head="{head}"]\').click()'
            times.append(page.evaluate(timed_js(click, timeout_ms=120_000)))
        cdp = page.context.new_cdp_session(page)
        cdp.send("HeapProfiler.collectGarbage")
        cdp.send("Performance.enable")
        heap = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}["JSHeapUsedSize"]
        browser.close()
    return statistics.median(times), heap / 1e6


def gpt2_times(repeats: int) -> dict[str, float] | None:
    if not (GPT2 / "vocab.json").is_file():
        print("GPT-2 part skipped: ../shared/data/gpt2 is absent")
        return None
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, model = gpt2_model(tmp)
        tok = load_tokenizer(model)
        source = (REPO / "corpora" / "tiny_tales.txt").read_text(encoding="utf-8")
        text = text_of(tok, source, 64)
        long = text_of(tok, source, 512)
        longest = text_of(tok, source, 846)
        ids = tok.encode(text)
        with Served(str(model)) as served:
            for name, path, params in (
                (
                    "explain (64 tokens, layer 5 head 7, one query)",
                    "/api/explain",
                    {"text": text, "layer": 5, "head": 7, "query": 40},
                ),
                ("explain (64 tokens, layer 5 head 7, whole)", "/api/explain", {"text": text, "layer": 5, "head": 7}),
                *(
                    entry
                    for n, t in ((64, text), (512, long), (846, longest))
                    for entry in (
                        (f"attention ({n} tokens, head 5.7)", "/api/attention", {"text": t, "layer": 5, "head": 7}),
                        (f"thumbnails ({n} tokens, 12 x 12, after that head)", "/api/thumbnails", {"text": t}),
                    )
                ),
                ("next (64 tokens)", "/api/next", {"text": text}),
            ):
                served.get(path, **params)
                took = [served.get(path, **params) for _ in range(repeats)]
                out[name] = median_ms([t for t, _ in took])
                out[name + " bytes"] = len(took[0][1])
            out["page: attention view with one query's arithmetic, opened (64 tokens)"] = page_open_ms(
                served.base + f"?view=attention&layer=5&head=7&query=40&text={urllib.parse.quote(text)}", repeats
            )
            heads = [(i // 12, i % 12) for i in range(1, HEADS_VISITED + 1)]
            ms, heap = page_heads(served.base + f"?view=attention&text={urllib.parse.quote(longest)}", heads)
            out[f"page: another head, 846 tokens ({HEADS_VISITED} heads clicked)"] = ms
            out[f"page: JS heap MB after {HEADS_VISITED} heads, 846 tokens"] = heap
        try:
            import torch
            from transformers import GPT2LMHeadModel
        except ImportError:
            print("transformers side skipped: pip install transformers torch")
            return out
        hf = GPT2LMHeadModel.from_pretrained(hf_dir, attn_implementation="eager").eval()
        x = torch.tensor([ids])
        with torch.no_grad():
            hf(x, output_attentions=True, output_hidden_states=True)
            took = []
            for _ in range(repeats):
                start = time.perf_counter()
                hf(x, output_attentions=True, output_hidden_states=True)
                took.append(time.perf_counter() - start)
        out["transformers forward, output_attentions (64 tokens)"] = median_ms(took)
        out["torch threads"] = torch.get_num_threads()
    return out


def ablation_clicks(base: str, texts: list[str]) -> dict[str, float]:
    """Section 4's page part: median ms from a click that knocks a part out to the view redrawn
    with the ablation's card, each repeat on a new text of `texts` (its answers not yet asked)."""
    from playwright.sync_api import sync_playwright

    clicks = {  # name: (view, the part's selector, by repeat)
        "attention: a head knocked out": ("attention", lambda i: f'.thumb[data-layer="{i % 2}"][data-head="{i % 4}"]'),
        "model: an MLP knocked out": ("model", lambda i: f'button.block[data-name="h.{i % 2}.mlp.c_fc"]'),
    }
    out = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        for name, (view, selector) in clicks.items():
            times = []
            for i, text in enumerate(texts):
                page.goto(base + f"?view={view}&text={urllib.parse.quote(text)}")
                page.wait_for_selector('body[data-ready="1"]')
                page.check("#ablate-switch")
                page.wait_for_selector("#abl-card:not([data-parts]) >> nth=0", state="attached")
                page.wait_for_selector('body[data-ready="1"]')
                click = f"document.querySelector({json.dumps(selector(i))}).click()"
                times.append(page.evaluate(timed_js(click, "document.getElementById('abl-kl') !== null")))
            out[name] = statistics.median(times) if all(t == t for t in times) else float("nan")
        browser.close()
    return out


def inside_times(served: Served, texts: list[str], repeats: int) -> dict[str, float]:
    """Section 4's server part: median ms of /api/lens, /api/attribution and one ablation, each
    repeat on a text not asked before (texts: at least 3 x repeats + 1 of them)."""
    fresh = iter(texts)
    served.get("/api/next", text=next(fresh))  # a first answer warms what a first view does
    asks = {
        "lens (64 tokens)": lambda t, i: ("/api/lens", {"text": t}),
        "attribution (64 tokens, the last position)": lambda t, i: ("/api/attribution", {"text": t}),
        "one ablation (64 tokens, next?ablate=L.H)": lambda t, i: (
            "/api/next",
            {"text": t, "ablate": f"{i % 12}.{5 * i % 12}"},
        ),
    }
    out: dict[str, float] = {}
    for name, ask in asks.items():
        took = []
        for i in range(repeats):
            path, params = ask(next(fresh), i)
            took.append(served.get(path, **params)[0])
        out[name] = median_ms(took)
    after = []
    for _ in range(repeats):  # the page's order: a text's lens, then its attribution from the same pass
        text = next(fresh)
        served.get("/api/lens", text=text)
        after.append(served.get("/api/attribution", text=text)[0])
    out["attribution after its text's lens"] = median_ms(after)
    return out


def gpt2_model(tmp: str) -> tuple[Path, Path]:
    """(the transformers checkpoint folder, the tk model imported from it): GPT-2 124M shapes, random."""
    from hf_import_memory import make_checkpoint

    hf_dir, model = Path(tmp) / "hf", Path(tmp) / "gpt2.safetensors"
    make_checkpoint(hf_dir, "F32")
    subprocess.run([sys.executable, "-m", "tokenkit", "import-hf", str(hf_dir), "-o", str(model)], check=True)
    return hf_dir, model


def windows(tok, n: int, count: int) -> list[str]:
    """`count` different n-token texts of the default corpus (from every 1,000th character on)."""
    source = (REPO / "corpora" / "tiny_tales.txt").read_text(encoding="utf-8")
    return [text_of(tok, source[1000 * k :], n) for k in range(count)]


def print_inside(run: Path, repeats: int, with_gpt2: bool) -> None:
    """Section 4, printed: GPT-2's shapes on the server, then the run's model on the page."""
    if with_gpt2 and (GPT2 / "vocab.json").is_file():
        with tempfile.TemporaryDirectory() as tmp:
            _, model = gpt2_model(tmp)
            texts = windows(load_tokenizer(model), 64, 4 * repeats + 1)
            with Served(str(model)) as served:
                print(
                    f"\n## inside the model, GPT-2 124M shapes, server time (ms; bar: 2000; {repeats} new texts each)"
                )
                for name, ms in inside_times(served, texts, repeats).items():
                    print(f"{name:<48} {ms:8.1f}  {'ok' if ms < 2000 else 'OVER'}")
    elif with_gpt2:
        print("GPT-2 part skipped: ../shared/data/gpt2 is absent")
    texts = windows(load_tokenizer(run), 64, max(5, repeats // 2))
    with Served(str(run)) as served:
        print(f"\n## ablation on the page, {run}: click to redrawn with the card (ms; bar: 500; 64 tokens)")
        for name, ms in ablation_clicks(served.base, texts).items():
            print(f"{name:<32} {ms:8.1f}  {'ok' if ms < 500 else 'OVER'}")


def write_log(path: Path, steps: int, start: int = 1) -> None:
    """`steps` step records from step `start` on, an evaluation every 1,000, as pipeline/train.py
    writes them (a session record first when `start` is 1); losses fall with noise."""
    import math
    import random

    rng = random.Random(start)
    config = {"steps": 2 * steps, "batch_size": 16, "context_length": 128, "lr": 3e-4, "eval_interval": 1000}
    with open(path, "a", encoding="utf-8") as f:
        if start == 1:
            session = {"type": "session", "step": 0, "utc": "2026-01-01T00:00:00Z", "workers": 2, "tokenkit": "0"}
            f.write(json.dumps(session | {"train_config": config, "unigram_baseline": 4.54}, sort_keys=True) + "\n")
        for step in range(start, start + steps):
            loss = 1.5 + 5 * math.exp(-step / 50_000) + rng.gauss(0, 0.05)
            record = {"type": "step", "step": step, "loss": loss, "lr": 3e-4 * min(1.0, step / 2000)}
            record |= {"grad_norm": abs(rng.gauss(0.8, 0.2)), "dt": rng.uniform(0.03, 0.05)}
            f.write(json.dumps(record, sort_keys=True) + "\n")
            if step % 1000 == 0:
                evaluation = {"type": "eval", "step": step, "val_loss": loss + 0.1, "best_val_loss": loss}
                f.write(json.dumps(evaluation, sort_keys=True) + "\n")


def log_times(steps: int) -> dict[str, float | int]:
    """Section 4: seconds of each read of a `steps`-step log, and the view's JSON."""
    import resource

    from tokenkit.cli import serve
    from tokenkit.pipeline import live, views

    out: dict[str, float | int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        path = run / "log.jsonl"
        write_log(path, steps)
        out["log MB"] = path.stat().st_size / 1e6
        log = live.TrainingLog(path)
        start = time.perf_counter()
        log.read()
        out["read whole (s)"] = time.perf_counter() - start
        out["steps read"] = len(log.steps)
        write_log(path, 1000, start=steps + 1)
        start = time.perf_counter()
        log.read()
        out["read 1k new lines (ms)"] = 1000 * (time.perf_counter() - start)
        start = time.perf_counter()
        doc = views.training_view(run, name="run", log=log)
        body = serve._json(doc)
        out["view JSON (ms)"] = 1000 * (time.perf_counter() - start)
        out["view JSON bytes"] = len(body)
        out["train points sent"] = len(doc["train"])
        out["peak memory (MB)"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default="runs/demo", help="a run directory (the Quick start's, by default)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-gpt2", action="store_true", help="skip the GPT-2-shaped part")
    parser.add_argument("--no-browser", action="store_true", help="skip the page part")
    parser.add_argument("--no-log", action="store_true", help="skip the long training log")
    parser.add_argument("--log-only", action="store_true", help="only the long training log (no run needed)")
    parser.add_argument("--log-steps", type=int, default=1_000_000, help="steps of the long training log")
    parser.add_argument(
        "--inside-only", action="store_true", help="only the lens, attribution and ablation (section 4)"
    )
    args = parser.parse_args()
    if args.log_only:
        print_log_times(args.log_steps)
        return
    run = Path(args.run)
    if not (run / "model.safetensors").is_file():
        raise SystemExit(
            f"{run} holds no model: run the Quick start first (tk pipeline corpora/tiny_tales.txt -o {run})"
        )
    if args.inside_only:
        print_inside(run, args.repeats, not args.no_gpt2)
        return
    tok = load_tokenizer(run)
    text = text_of(tok, (REPO / "corpora" / "tiny_tales.txt").read_text(encoding="utf-8")[5000:], 64)
    print(f"# tk serve {run}: a {len(tok.encode(text))}-token text, {args.repeats} repeats, medians")
    with Served(str(run)) as served:
        print("\n## server time per request (ms; bar: 50)")
        for name, ms in server_times(served, text, args.repeats, with_model=True).items():
            verdict = "(not a page request)" if name.endswith("whole") else "ok" if ms < 50 else "OVER"
            print(f"{name:<24} {ms:8.1f}  {verdict}")
        if not args.no_browser:
            print("\n## page update in Chromium, event to redrawn (ms; bar: 200)")
            for name, ms in page_times(served.base, text, max(5, args.repeats // 2)).items():
                print(f"{name:<32} {ms:8.1f}  {'ok' if ms < 200 else 'OVER'}")
    if not args.no_gpt2:
        times = gpt2_times(max(3, args.repeats // 3))
        if times:
            print("\n## GPT-2 124M shapes (ms; bar: explain within 2000; the page asks one query)")
            for name, value in times.items():
                print(f"{name:<52} {value:10.1f}" if "bytes" not in name else f"{name:<52} {value:10,.0f}")
            peer = times.get("transformers forward, output_attentions (64 tokens)")
            if peer:
                ours = (
                    times["attention (64 tokens, head 5.7)"] + times["thumbnails (64 tokens, 12 x 12, after that head)"]
                )
                print(f"attention: tk serve (request + JSON) / transformers forward alone = {ours / peer:.2f}x")
    print_inside(run, args.repeats, not args.no_gpt2)
    if not args.no_log:
        print_log_times(args.log_steps)


def print_log_times(steps: int) -> None:
    print(f"\n## a {steps:,}-step training log (/api/training; once each)")
    for name, value in log_times(steps).items():
        print(f"{name:<28} {value:12,}" if isinstance(value, int) else f"{name:<28} {value:12,.2f}")


if __name__ == "__main__":
    main()
