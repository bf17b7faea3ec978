"""Baselines beside ours: transformers (PyTorch) greedy generate and its prompt-lookup decoding.

Decodes the same prompts as `eagle-jax bench` (same file, --limit per category, --categories,
multi-turn answers fed back, the GGUF's own chat template) and writes a JSON of tokens/s. New tokens
are counted as generated token ids (not by re-tokenizing text); wall time covers `generate` only,
after one warm-up call. Needs torch + transformers + gguf, not JAX:

  GGUF=$(.venv/bin/python -c "from eagle_jax.loading import resolve_model_path as r; print(r('smollm2-135m-instruct'))")
  .venv311/bin/python results/plain_vs_transformers/bench_transformers.py --prompts P.jsonl --gguf "$GGUF" --max-new-tokens 128 --limit 5 --out hf.json
  .venv/bin/eagle-jax bench --prompts P.jsonl --ar-only --max-new-tokens 128 --limit 5 --out ours.json

Plain decoding, ours vs transformers: ours.json summary.ar_tokens_per_s / hf.json summary.ar_tokens_per_s.
Output: {"summary": {num_prompts, new_tokens, ar_tokens_per_s, pld_tokens_per_s, pld_speedup,
identical (greedy == prompt lookup, token for token), config}, "per_prompt": [{question_id, category,
new_tokens, ar_wall_s, pld_wall_s, ar_tokens_per_s, pld_tokens_per_s}]}.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_prompt_module():
    """infer/prompts.py by path: this venv need not have eagle-jax installed (it has no JAX)."""
    sys.path.insert(0, ROOT)  # for eagle_jax.errors (infer/prompts.py imports it) and eagle_jax.files
    spec = importlib.util.spec_from_file_location("bench_prompts", os.path.join(ROOT, "infer", "prompts.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def generate(model, tokenizer, ids, max_new_tokens: int, lookup: int | None):
    """(new token ids, wall seconds) of one greedy generate; `lookup` = prompt_lookup_num_tokens."""
    import torch

    extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id, **extra,
        )
    return out[0, ids.shape[1]:].tolist(), time.perf_counter() - start


def run_conversation(prompts_module, model, tokenizer, prompt, max_new_tokens: int, lookup: int | None):
    """Turns in order, each after this mode's own answers; returns (token lists per turn, wall seconds)."""
    answers, tokens, wall = [], [], 0.0
    for turn in range(len(prompt.turns)):
        messages = prompts_module.messages_for_turn(prompt, answers, turn)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        new, seconds = generate(model, tokenizer, ids, max_new_tokens, lookup)
        answers.append(tokenizer.decode(new, skip_special_tokens=True))
        tokens.append(new)
        wall += seconds
    return tokens, wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", required=True)
    p.add_argument("--gguf", required=True, help="the .gguf file our bench loads (see the module docstring)")
    p.add_argument("--out", required=True)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--limit", type=int, default=None, help="the first K prompts of each category")
    p.add_argument("--categories", default=None, help="comma list")
    p.add_argument("--prompt-lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens of the PLD baseline")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = p.parse_args()

    import torch
    import transformers
    from tqdm import tqdm

    prompts_module = load_prompt_module()
    from eagle_jax.files import write_json_atomic  # from the source tree, put on sys.path just above
    try:
        prompts = prompts_module.select_prompts(
            prompts_module.load_prompts(args.prompts), args.limit, args.categories and args.categories.split(",")
        )
    except prompts_module.EagleError as e:
        print(f"bench_transformers: error: {e}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    directory, name = os.path.split(os.path.abspath(args.gguf))
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32).eval()
    run_conversation(prompts_module, model, tokenizer, prompts[0], args.max_new_tokens, None)  # warm-up

    rows, identical = [], True
    for prompt in tqdm(prompts, unit="prompt"):
        ar_tokens, ar_wall = run_conversation(prompts_module, model, tokenizer, prompt, args.max_new_tokens, None)
        pld_tokens, pld_wall = run_conversation(prompts_module, model, tokenizer, prompt, args.max_new_tokens, args.prompt_lookup_tokens)
        identical &= ar_tokens == pld_tokens
        n_ar, n_pld = sum(map(len, ar_tokens)), sum(map(len, pld_tokens))
        rows.append({"question_id": prompt.question_id, "category": prompt.category, "new_tokens": n_ar,
                     "pld_new_tokens": n_pld, "ar_wall_s": ar_wall, "pld_wall_s": pld_wall,
                     "ar_tokens_per_s": n_ar / ar_wall, "pld_tokens_per_s": n_pld / pld_wall})
    ar_tps = sum(r["new_tokens"] for r in rows) / sum(r["ar_wall_s"] for r in rows)
    pld_tps = sum(r["pld_new_tokens"] for r in rows) / sum(r["pld_wall_s"] for r in rows)
    summary = {
        "num_prompts": len(rows), "new_tokens": sum(r["new_tokens"] for r in rows),
        "ar_tokens_per_s": ar_tps, "pld_tokens_per_s": pld_tps, "pld_speedup": pld_tps / ar_tps, "identical": identical,
        "config": {"gguf": os.path.abspath(args.gguf), "max_new_tokens": args.max_new_tokens, "limit_per_category": args.limit,
                   "prompt_lookup_num_tokens": args.prompt_lookup_tokens, "threads": torch.get_num_threads(),
                   "torch": torch.__version__, "transformers": transformers.__version__, "dtype": "float32", "device": "cpu"},
    }
    write_json_atomic(args.out, {"summary": summary, "per_prompt": rows})
    print(f"transformers greedy {ar_tps:.1f} tok/s, prompt lookup {pld_tps:.1f} tok/s ({pld_tps / ar_tps:.2f}x), "
          f"{summary['new_tokens']} tokens over {len(rows)} prompts; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
