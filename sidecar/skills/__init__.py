"""Skills: SKILL.md folders the sidecar lists, reads, writes and proposes (service.py owns the
``skill:*`` methods; library.py and archive.py the disk, manifest.py the front matter,
proposer.py the model's proposals). Wired by the App; imports nothing above the engine."""
