"""Long-term memory and Soul.md: what an assistant remembers across sessions.

    text.py       normalizing, hashing and flagging a memory's text; rendering memories to a
                  model as escaped data (never instructions)
    retriever.py  MemoryRetriever: the scope's memories for a request, through the retrieval
                  core of sidecar/retrieval (lexical leg, vector indexes, fusion)
    service.py    MemoryService: memory:*, the basic memory text, embedding new memories,
                  what requests and tools get
    tools.py      memory_search, memory_save, memory_update, memory_forget, soul_update
    encoder.py    MemoryEncoder: after a completed reply, in the background, what is worth
                  remembering (off / propose / auto per assistant)
    soul.py       SoulService: assistant:soul:*, and the Soul.md a request gets

The tables are MemoryRepo's and SoulRepo's (sidecar/store/memory.py), reached only through
``AsyncStore.run``. Scopes: ``global`` (every assistant) or an assistant's id (only that
assistant); every read names its scopes, so one assistant's memories never reach another's
requests.
"""
