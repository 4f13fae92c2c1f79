"""The app's prompt presets and the live decode's default settings: what the Live tab offers and what
`python -m specdec record` records, one definition for both."""
from __future__ import annotations

import re

from specdec.drafters import HYBRID_SUFFIX

SUMMARY_PROMPT = (  # a summary repeats the text's phrases: what prompt lookup drafts from
    "Text: The city council voted on Tuesday to extend the bicycle lane network by 40 kilometres over the next "
    "three years. The extension will connect the northern suburbs to the city centre and to the main railway "
    "station. The council said the project will cost 12 million euros and will be paid for by the regional "
    "transport fund.\n\nSummarise the text above in two sentences.\nSummary: The city council voted on Tuesday to")

PROMPTS = {  # preset name -> prompt text (the first is the live tab's default: English code, where speculation works)
    "Python code": "def fibonacci(n: int) -> list[int]:\n    \"\"\"Return the first n Fibonacci numbers.\"\"\"\n",
    "summarise (prompt lookup copies from it)": SUMMARY_PROMPT,
    "Chinese chat: 今天天气": "今天天气",
    "finance / quant code": (
        "import pandas as pd\n\n"
        "def max_drawdown(prices: pd.Series) -> float:\n"
        "    \"\"\"Largest peak-to-trough fall of a price series, as a fraction of the peak.\"\"\"\n"),
    "Chinese medical question": "医学问题：糖尿病患者空腹血糖控制目标是多少？\n医学回答：",
    "English chat": "User: What is speculative decoding, in two sentences?\nAssistant:",
}
LIVE_K = "auto"  # the live tab's k: chosen each round from the measured acceptance and costs
LIVE_MAX_NEW_TOKENS = 48  # the live tab's max new tokens (within the host's cap)


def live_draft(model: str) -> str:
    """The live tab's draft for a draft model: the model behind prompt lookup (`MODEL+lookup`, which copies where the
    model has just missed, starts the copy itself or a copy is on track: level with the model alone on the suite,
    well ahead where an answer repeats its prompt; docs/performance.md)."""
    return model + HYBRID_SUFFIX


def slug(name: str) -> str:
    """A preset's name as a file name: its lower-case ASCII words joined by '-' ("Chinese chat: 今天天气" ->
    "chinese-chat")."""
    return "-".join(re.findall(r"[a-z0-9]+", name.lower()))


def preset(name: str) -> str:
    """The prompt of preset `name`; a ValueError of one line listing the presets for another name."""
    if name not in PROMPTS:
        raise ValueError(f"no prompt preset {name!r}; the presets: {', '.join(repr(p) for p in PROMPTS)}")
    return PROMPTS[name]
