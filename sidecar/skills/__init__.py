"""Skills: SKILL.md folders the sidecar lists, reads, writes and proposes (service.py owns the
``skill:*`` methods; library.py and archive.py the disk, manifest.py the front matter rules,
whose one reader is sidecar/tools/skills.py, below this package, so that the skill tools read
a SKILL.md as skill:* checks it; proposer.py the model's proposals). Wired by the App;
imports nothing above the engine."""
