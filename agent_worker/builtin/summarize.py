"""`summarize`: a real extractive summarizer (no model, no download).

Sentences are scored by the frequency of their content words across the whole text (stopwords
left out, each sentence's score normalised by its length so long sentences do not win by size),
with a small bonus for the opening sentence; the best ones are returned in their original order.

Payload: {"text": str, "max_sentences": int = 3}
Result:  {"summary": str, "sentences": [str], "sentence_count": int, "compression": float}
"""

from __future__ import annotations

import re
from collections import Counter

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent_worker.context import TaskContext
from agent_worker.errors import InvalidRequest

# After . ! ? and whitespace; after CJK full stops (no space follows them); at blank lines.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[\u3002\uff01\uff1f])\s*|\n{2,}")
_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?", re.UNICODE)
_STOPWORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers herself him himself his how i if in into is it its itself just
    me more most my myself no nor not now of off on once only or other our ours ourselves out over
    own same she should so some such than that the their theirs them themselves then there these
    they this those through to too under until up very was we were what when where which while who
    whom why will with would you your yours yourself yourselves also may might must shall one two
    many much new like well even get got
    """.split()  # noqa: SIM905 - a word list reads best as text
)


class SummarizeRequest(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"text": "Reach routes each task to the best agent. It retries what fails. "
                 "What fails for good lands in a dead-letter stream.", "max_sentences": 1}]})

    text: str = Field(description="The text to summarize")
    max_sentences: int = Field(3, ge=1, le=50, description="Most sentences in the summary")

    @field_validator("text")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("text is empty")
        return value


def split_sentences(text: str) -> list[str]:
    parts = (s.strip() for s in _SENTENCE_END.split(text.strip()))
    return [p for p in parts if p]


def words(sentence: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(sentence)]


def summarize(text: str, max_sentences: int = 3) -> list[str]:
    sentences = split_sentences(text)
    if len(sentences) <= max_sentences:
        return sentences
    content = [[w for w in words(s) if w not in _STOPWORDS and len(w) > 1] for s in sentences]
    freq = Counter(w for ws in content for w in ws)
    if not freq:
        return sentences[:max_sentences]
    top = max(freq.values())
    scores = []
    for index, ws in enumerate(content):
        score = sum(freq[w] / top for w in ws) / (len(ws) ** 0.5 if ws else 1.0)
        if index == 0:
            score *= 1.15  # openings tend to state the topic
        scores.append((score, index))
    best = sorted(sorted(scores, key=lambda x: (-x[0], x[1]))[:max_sentences], key=lambda x: x[1])
    return [sentences[i] for _, i in best]


class SummarizeResult(BaseModel):
    summary: str
    sentences: list[str] = Field(description="The sentences chosen, in their order")
    sentence_count: int = Field(description="Sentences in the whole text")
    compression: float = Field(description="The summary's length over the text's")


async def handle(ctx: TaskContext, payload: SummarizeRequest) -> SummarizeResult:
    """Summarize a text: its most telling sentences, in their order (extractive, no model)."""
    if not isinstance(payload, SummarizeRequest):  # called directly, not through the worker
        payload = SummarizeRequest.model_validate(payload)
    sentences = split_sentences(payload.text)
    if not sentences:
        raise InvalidRequest("text has no sentences")
    await ctx.progress(0.3, f"split into {len(sentences)} sentences")
    chosen = summarize(payload.text, payload.max_sentences)
    await ctx.progress(0.9, "scored sentences")
    summary = " ".join(chosen)
    return SummarizeResult(summary=summary, sentences=chosen, sentence_count=len(sentences),
                           compression=round(len(summary) / max(1, len(payload.text)), 3))
