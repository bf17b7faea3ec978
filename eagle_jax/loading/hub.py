"""Models and heads named by Hugging Face Hub id: `org/name[@revision]`, or `org/name/FILE.gguf[@revision]`.

Only the files eagle-jax reads are downloaded (config, tokenizer, one weight format; for a GGUF repo,
the named file), into the Hub's own cache, with huggingface_hub's progress bars. HF_HOME, HF_TOKEN,
HF_ENDPOINT and HF_HUB_OFFLINE are honoured as huggingface_hub reads them. Each failure (no such
repo, a gated repo without a token, no network and nothing cached) is one EagleError line.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re

from tqdm.auto import tqdm

from eagle_jax.errors import EagleError

# owner/name as the Hub spells them, an optional path inside the repo (a .gguf file), @revision
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]*\w)(?P<file>(?:/[\w.-]+)*/[\w.-]+\.gguf)?(?:@(?P<revision>[\w./-]+))?")
CONFIG_FILES = ["config.json", "generation_config.json"]
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json"]
HEAD_FILES = ["tree.json", "tree_sampled.json", "batch_policy.json"]  # what `bench --auto-tune` saved with a head
SAFETENSORS = ["*.safetensors", "model.safetensors.index.json"]
TORCH_BINS = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]


def parse_hub_id(name: str) -> tuple[str, str | None, str | None] | None:
    """(repo id, file in the repo or None, revision or None), or None when `name` is no hub id."""
    match = HUB_ID.fullmatch(name)
    if match is None or ".." in match["repo"]:
        return None
    return match["repo"], match["file"] and match["file"][1:], match["revision"]


@contextlib.contextmanager
def hub_errors(name: str):
    """huggingface_hub's exceptions as one error line that says what to do."""
    from huggingface_hub import constants, errors

    try:
        yield
    except errors.GatedRepoError:
        raise EagleError(f"{name} is a gated repository: accept its terms on the Hub, then set HF_TOKEN "
                         "(or run `hf auth login`) to a token of that account") from None
    except errors.RepositoryNotFoundError:
        raise EagleError(f"{name}: no such local path, and no such repository on {constants.ENDPOINT} "
                         "(or it is private: set HF_TOKEN)") from None
    except errors.RevisionNotFoundError:
        raise EagleError(f"{name}: the repository has no such revision (branch, tag or commit)") from None
    except errors.RemoteEntryNotFoundError:
        raise EagleError(f"{name}: the repository has no such file") from None
    except errors.LocalEntryNotFoundError:
        how = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else f"{constants.ENDPOINT} cannot be reached"
        raise EagleError(f"{name}: {how} and the Hugging Face cache ({constants.HF_HUB_CACHE}) does not hold it; "
                         "download it once with the network on") from None
    except errors.HfHubHTTPError as e:
        raise EagleError(f"{name}: the Hub answered {str(e).splitlines()[0]}") from None


def choose_weights(files: list[str]) -> list[str]:
    """Patterns of the one weight format to fetch: safetensors when the repo has them, else .bin."""
    def has(patterns):
        return any(fnmatch.fnmatch(f, p) for f in files for p in patterns)

    return SAFETENSORS if has(SAFETENSORS) or not has(TORCH_BINS) else TORCH_BINS


class SilentBar(tqdm):
    """A progress bar that shows nothing (for listing a repo, which downloads nothing)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **(kwargs | {"disable": True}))


def download_directory(name: str, repo: str, revision: str | None, extra: list[str]) -> str:
    """The local snapshot directory of `repo` holding its configs, one weight format and `extra`."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import DryRunError, LocalEntryNotFoundError

    with hub_errors(name):
        try:  # list the repo's weights (nothing is downloaded) to fetch only one format
            listed = snapshot_download(repo, revision=revision, allow_patterns=SAFETENSORS + TORCH_BINS + ["*.gguf"],
                                       dry_run=True, tqdm_class=SilentBar)
        except DryRunError:  # the Hub cannot be asked: take the format the cache holds
            formats = [SAFETENSORS, TORCH_BINS]
        else:
            files = [f.filename for f in listed]
            ggufs = [f for f in files if f.endswith(".gguf")]
            if ggufs and len(ggufs) == len(files):
                raise EagleError(f"{name} holds GGUF files: name one, e.g. {repo}/{ggufs[0]}"
                                 + (f"@{revision}" if revision else ""))
            formats = [choose_weights(files)]
        for i, weights in enumerate(formats):
            try:
                return snapshot_download(repo, revision=revision, allow_patterns=CONFIG_FILES + weights + extra)
            except LocalEntryNotFoundError:
                if i == len(formats) - 1:
                    raise
def download_file(name: str, repo: str, filename: str, revision: str | None) -> str:
    from huggingface_hub import hf_hub_download

    with hub_errors(name):
        return hf_hub_download(repo, filename, revision=revision)


def resolve_hub_model(name: str) -> str | None:
    """Local path of a target named by hub id (a snapshot directory, or the .gguf file), or None."""
    parsed = parse_hub_id(name)
    if parsed is None:
        return None
    repo, filename, revision = parsed
    if filename is not None:
        return download_file(name, repo, filename, revision)
    return download_directory(name, repo, revision, TOKENIZER_FILES)


def resolve_head_path(name: str) -> str:
    """Local directory of a draft head: an existing path as given (it wins over a hub id), else the
    snapshot of Hub id `org/name[@revision]`; anything else comes back unchanged, for the loader to refuse."""
    parsed = parse_hub_id(name)
    if os.path.exists(name) or parsed is None or parsed[1] is not None:
        return name
    repo, _, revision = parsed
    return download_directory(name, repo, revision, HEAD_FILES)
