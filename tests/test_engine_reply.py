"""ReplyBuilder: parts of a streaming reply."""

from protocol.types import TextPart, ThinkingPart
from sidecar.engine.reply import ReplyBuilder


def test_thinking_signature_stays_on_its_block():
    reply = ReplyBuilder()
    reply.add_delta("thinking", "let me ")
    reply.add_delta("thinking", "think")
    reply.sign_thinking("sig-1")
    reply.add_delta("thinking", "second block")
    reply.add_delta("text", "answer")
    snap = reply.snapshot()
    assert snap.parts == [
        ThinkingPart(text="let me think", signature="sig-1"),
        ThinkingPart(text="second block"),
        TextPart(text="answer"),
    ]
    assert snap.text_content == "answer" and snap.content_type == "multipart"
