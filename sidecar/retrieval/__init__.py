"""Knowledge bases: from a document to the chunks a request cites.

    extract.py     document kinds and their text (HTML via selectolax, PDF via pypdf, pages)
    chunking.py    structure-aware chunks sized in tokens, content-addressed ids
    embeddings.py  embedding models: OpenAI-compatible / Ollama over the provider transport,
                   the local wordllama embedder
    vectors.py     VectorIndex: cosine over an in-memory float32 matrix, updated in place
                   (exact; a large one ranks by sign codes first, exact scores after)
    indexes.py     the VectorIndex of each (base, model): lazy load, deltas, a search over cores
    fusion.py      score fusion weighed by each leg's evidence (knowledge), weighted
                   reciprocal-rank fusion (memory), relevance floors, diversity, token budget
    retriever.py   HybridRetriever: the lexical leg + vector legs -> ranked chunks (results.py)
    citations.py   citation markers per reply (CitationLedger) and the tagged <knowledge> block
    paths.py       files under the allowed roots (sidecar/confine.py, the one rule), read bounded
    ingest.py      Indexer: a document to ``ready``/``error``; re-embedding a base
    service.py     KnowledgeService: kb:*, the ingestion queue, progress, what requests retrieve

The tables are KnowledgeRepo's (sidecar/store/knowledge.py, ``Store.knowledge``; each base's
full-text table: sidecar/store/kb_lexical.py), reached from
async code only through ``AsyncStore.run``; file and CPU work use anyio's own worker threads. Arrows: the pipeline
(KnowledgeRetrievalTransformer) and the tools (knowledge_search) call in; this package calls
the store, the provider transport and the token counter of sidecar/tokens.py.
The long-term memory (sidecar/memory) retrieves with the same core: the FTS terms, the
VectorIndexes (keyed by memory scope) and fusion.
Heavy imports (numpy, httpx2, selectolax, pypdf) happen on first use, not at start-up.
"""
