"""The generated TypeScript client: compiled output fresh, strict compile of it and of the
example main process / preload / renderer, and Node's test runner driving the real sidecar
(handshake, a streamed reply from the scripted provider, errors, abort, crash + restart,
quit) through the compiled client.js."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from node_client import NODE_TOOLS, ROOT, assert_all_ran, python_sidecar, run, run_node_client_tests, tsc

from protocol import PROTOCOL_VERSION, ErrorCode

GEN_SCRIPT = ROOT / "tools" / "gen_protocol.py"
STRICT_FLAGS = ["--strict", "--isolatedModules", "--verbatimModuleSyntax"]


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protocol_ts", GEN_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compiled_client_matches_its_source(gen: ModuleType) -> None:
    tsc()  # skip/fail with the reason when the compiler is not there
    compiled = gen.compiled(gen.generated())
    stems = ("client", "connection", "errors", "streams", "protocol")
    assert {p.name for p in compiled} == {f"{stem}{suffix}" for stem in stems for suffix in (".js", ".d.ts")}
    stale = [p.name for p, text in compiled.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    assert not stale, f"stale compiled client files {stale}: run `python3 dev.py gen`"


def test_strict_compile_of_the_generated_files_and_the_examples() -> None:
    compiler = tsc()
    for config in ("tsconfig.json", "tsconfig.renderer.json"):
        done = run([*compiler, "-p", str(NODE_TOOLS / config), *STRICT_FLAGS])
        assert done.returncode == 0, f"tsc -p {config} failed:\n{done.stdout}{done.stderr}"


def test_type_checks_catch_what_they_claim(tmp_path: Path) -> None:
    """Each @ts-expect-error line of the type checks is needed: without it the file fails."""
    compiler = tsc()
    source = (NODE_TOOLS / "typecheck" / "client-types.ts").read_text(encoding="utf-8")
    expected = source.count("// @ts-expect-error")
    assert expected >= 8
    loose = re.sub(r"^\s*// @ts-expect-error.*\n", "", source, flags=re.MULTILINE)
    probe = NODE_TOOLS / "typecheck" / "_probe.ts"
    probe.write_text(loose, encoding="utf-8")
    try:
        config = tmp_path / "tsconfig.json"
        config.write_text(
            json.dumps({
                "extends": str(NODE_TOOLS / "tsconfig.json"),
                "compilerOptions": {"typeRoots": [str(NODE_TOOLS / "node_modules" / "@types")]},
                "files": [str(NODE_TOOLS / "stubs" / "electron.d.ts"), str(probe)],
            }),
            encoding="utf-8",
        )
        done = run([*compiler, "-p", str(config)])
    finally:
        probe.unlink()
    errors = [line for line in done.stdout.splitlines() if "_probe.ts(" in line and "error TS" in line]
    assert len(errors) == expected, done.stdout


@pytest.mark.anyio
async def test_node_client_against_the_real_sidecar(tmp_path: Path) -> None:
    command, args = python_sidecar()
    output = await run_node_client_tests(tmp_path, command, args)
    assert_all_ran(output)


def test_the_readme_snippets_compile(tmp_path: Path) -> None:
    """README's main-process snippet, as an app would have it (the generated folder copied
    to ./sidecar/), compiles under the same strict settings as the example."""
    compiler = tsc()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Main process"):]
    snippet = section[section.index("```ts\n") + 6: section.index("\n```", section.index("```ts\n"))]
    source = "declare const logFile: { write(text: string): void };\n" + snippet.replace(
        '"./sidecar/', '"../../../protocol/generated/'
    )
    probe = NODE_TOOLS / "typecheck" / "_readme.ts"
    probe.write_text(source, encoding="utf-8")
    try:
        config = tmp_path / "tsconfig.json"
        config.write_text(
            json.dumps({
                "extends": str(NODE_TOOLS / "tsconfig.json"),
                "compilerOptions": {"typeRoots": [str(NODE_TOOLS / "node_modules" / "@types")]},
                "files": [str(NODE_TOOLS / "stubs" / "electron.d.ts"), str(probe)],
            }),
            encoding="utf-8",
        )
        done = run([*compiler, "-p", str(config), *STRICT_FLAGS])
    finally:
        probe.unlink()
    assert done.returncode == 0, f"README's snippet does not compile:\n{done.stdout}{done.stderr}"


def test_a_plain_tsc_build_of_the_copied_folder_runs(tmp_path: Path) -> None:
    """README's "copy the folder into the app": the generated folder copied to ./sidecar/,
    an app compiled by a plain ``tsc`` into ``dist/`` (outDir), and run with Node: every
    module it imports is emitted (protocol.js too), and it talks to the real sidecar."""
    compiler = tsc()
    app = tmp_path / "app"
    shutil.copytree(ROOT / "protocol" / "generated", app / "sidecar")
    (app / "package.json").write_text('{"type": "module", "private": true}\n', encoding="utf-8")
    (app / "main.ts").write_text(
        'import { createSidecar, ErrorCode, PROTOCOL_VERSION } from "./sidecar/client.js";\n'
        'const [command, args, dataDir] = process.argv.slice(2) as [string, string, string];\n'
        "const sidecar = await createSidecar({ command, args: JSON.parse(args) as string[], dataDir });\n"
        'const list = await sidecar.call("chat:session:list");\n'
        "const exit = await sidecar.close();\n"
        "console.log(JSON.stringify({ protocol: PROTOCOL_VERSION, total: list.total, notFound: ErrorCode.NOT_FOUND, code: exit.code }));\n",
        encoding="utf-8",
    )
    (app / "tsconfig.json").write_text(json.dumps({
        "compilerOptions": {
            "strict": True, "module": "nodenext", "moduleResolution": "nodenext", "target": "es2022",
            "outDir": "dist", "rootDir": ".", "types": ["node"], "skipLibCheck": False,
            "typeRoots": [str(NODE_TOOLS / "node_modules" / "@types")],
        },
        "include": ["**/*.ts"],
        "exclude": ["dist"],
    }), encoding="utf-8")
    built = run([*compiler, "-p", str(app / "tsconfig.json")])
    assert built.returncode == 0, f"plain tsc failed:\n{built.stdout}{built.stderr}"
    assert (app / "dist" / "sidecar" / "protocol.js").is_file()
    command, args = python_sidecar()
    ran = run([compiler[0], str(app / "dist" / "main.js"), command, json.dumps(args), str(tmp_path / "data")])
    assert ran.returncode == 0, f"node dist/main.js failed:\n{ran.stdout}{ran.stderr}"
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == {
        "protocol": PROTOCOL_VERSION, "total": 0, "notFound": int(ErrorCode.NOT_FOUND), "code": 0
    }
