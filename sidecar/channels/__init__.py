"""IM channels: messages from Feishu/Lark, DingTalk, WeCom, WeChat, Slack or a plain host,
answered in the same sessions as the desktop chat (seed 004 §3.1 channel_id/channel_meta,
§4.1 PreProcessor 6 and PostProcessor 5).

The sidecar never talks to a platform: the host hands messages in (``channel:message``) and
delivers the replies it is sent (``channel:reply``, acknowledged with ``channel:ack``).

Modules, one job each:
    platforms.py   per-platform defaults; a channel's configuration resolved and checked
    inbound/       platform markup -> the user turn (one adapter per platform)
    dialects.py    what each platform's Markdown dialect can show
    render.py      Markdown -> lines of a dialect (fences, tables, footnotes, media)
    mentions.py    a reply's mentions made inert unless the channel allows them
    split.py       lines -> chunks within a platform's limits
    compose.py     a finished reply -> the platform messages carrying it
    routing.py     the session of a chat, by the scope rule; /new
    watch.py       following a turn on the EventHub until its reply is final
    stream.py      reply mode stream: edits in place, coalesced
    delivery.py    the outbox: channel:reply, acks, retries, rate limits
    ratelimit.py   token buckets and the loop guard
    workers.py     one worker per session / chat
    service.py     the channel:* methods and the flow that ties these together
The rows live in sidecar/store/channels.py.
"""
