"""Which tool parser a model gets when none is configured (behaviors.md §F.7).

The table is the reference gateway's (`crates/tool_parser/src/factory.rs`): an exact model id
first; otherwise every pattern ending in `*` whose stem (the pattern without the `*`) is a
case-insensitive substring of the id, the longest stem winning (on a tie, the earlier row);
no match → `passthrough`.
"""

from __future__ import annotations

MODEL_PATTERNS: tuple[tuple[str, str], ...] = (
    ("gpt-4*", "json"),
    ("gpt-3.5*", "json"),
    ("gpt-4o*", "json"),
    ("claude-*", "json"),
    ("mistral-*", "mistral"),
    ("mixtral-*", "mistral"),
    ("Qwen/Qwen3.5*", "qwen_xml"),
    ("Qwen3.5*", "qwen_xml"),
    ("qwen3.5*", "qwen_xml"),
    ("qwen/qwen3.5*", "qwen_xml"),
    ("Qwen/Qwen3.6*", "qwen_xml"),
    ("Qwen3.6*", "qwen_xml"),
    ("qwen3.6*", "qwen_xml"),
    ("qwen/qwen3.6*", "qwen_xml"),
    ("Qwen/Qwen3.8*", "qwen_xml"),
    ("Qwen3.8*", "qwen_xml"),
    ("qwen3.8*", "qwen_xml"),
    ("qwen/qwen3.8*", "qwen_xml"),
    ("Qwen/Qwen3-Coder*", "qwen_xml"),
    ("Qwen3-Coder*", "qwen_xml"),
    ("qwen3-coder*", "qwen_xml"),
    ("qwen/qwen3-coder*", "qwen_xml"),
    ("qwen*", "qwen"),
    ("Qwen*", "qwen"),
    ("nemotron-3*", "qwen_xml"),
    ("llama-4*", "pythonic"),
    ("meta-llama-4*", "pythonic"),
    ("llama-3.2*", "llama"),
    ("meta-llama-3.2*", "llama"),
    ("llama-*", "json"),
    ("meta-llama-*", "json"),
    ("deepseek-v3*", "deepseek"),
    ("deepseek-ai/DeepSeek-V3*", "deepseek"),
    ("deepseek-v3.1*", "deepseek31"),
    ("deepseek-ai/DeepSeek-V3.1*", "deepseek31"),
    ("deepseek-v3.2-exp*", "deepseek31"),
    ("deepseek-ai/DeepSeek-V3.2-Exp*", "deepseek31"),
    ("deepseek-v3.2*", "deepseek32"),
    ("deepseek-ai/DeepSeek-V3.2*", "deepseek32"),
    ("deepseek-v4*", "deepseek_v4"),
    ("deepseek-ai/DeepSeek-V4*", "deepseek_v4"),
    ("deepseek-*", "pythonic"),
    ("glm-4.5*", "glm45_moe"),
    ("glm-4.6*", "glm45_moe"),
    ("glm-4.7*", "glm47_moe"),
    ("glm-5*", "glm47_moe"),
    ("glm-*", "json"),
    ("sarashina*", "sarashina"),
    ("Sarashina*", "sarashina"),
    ("step3*", "step3"),
    ("Step-3*", "step3"),
    ("kimi-k2*", "kimik2"),
    ("Kimi-K2*", "kimik2"),
    ("moonshot*/Kimi-K2*", "kimik2"),
    ("kimi-k3*", "kimi_k3"),
    ("Kimi-K3*", "kimi_k3"),
    ("moonshot*/Kimi-K3*", "kimi_k3"),
    ("kimi_k3*", "kimi_k3"),
    ("Kimi_K3*", "kimi_k3"),
    ("moonshot*/Kimi_K3*", "kimi_k3"),
    ("inkling*", "inkling"),
    ("Inkling*", "inkling"),
    ("minimax*", "minimax_m2"),
    ("MiniMax*", "minimax_m2"),
    ("command-r*", "cohere"),
    ("command-r-plus*", "cohere"),
    ("command-a*", "cohere"),
    ("c4ai-command*", "cohere"),
    ("cohere*", "cohere"),
    ("CohereForAI*", "cohere"),
    ("gemini-*", "json"),
    ("palm-*", "json"),
    ("gemma-*", "json"),
)

DEFAULT = "passthrough"

_EXACT = dict(MODEL_PATTERNS)
# Stems as the reference strips them: only the trailing `*` goes, so `moonshot*/Kimi-K2` keeps
# its inner `*` and (like the reference's) only matches an id containing that literal text.
_STEMS = tuple((pattern[:-1].lower(), parser) for pattern, parser in MODEL_PATTERNS if pattern.endswith("*"))


def detect_tool_parser(model_id: str) -> str:
    """The tool parser name for `model_id` by the §F.7 table (`passthrough` when none fits)."""
    if model_id in _EXACT:
        return _EXACT[model_id]
    lowered = model_id.lower()
    best, found = -1, DEFAULT
    for stem, parser in _STEMS:
        if len(stem) > best and stem in lowered:
            best, found = len(stem), parser
    return found
