"""``--with-flink``: the same workload on Flink 2.3's real heap keyed state backend.

Needs a JDK (``java`` and ``javac``, 17 or newer) and ``flink-dist-*.jar`` from the PyPI package
``apache-flink-libraries`` (``pyflink/lib``; or ``$COWMAP_FLINK_DIST_JAR``), plus the program
``benches/flink/FlinkStateBench.java`` of a cowmap checkout (or ``$COWMAP_FLINK_BENCH_SRC``).
It is compiled once into ``~/.cache/cowmap/flink-bench/<hash>/`` and run in one JVM, which reads a
plan and the records files written here and prints one ``RESULT {json}`` line per config.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from cowmap.bench.workload import Settings, available_memory, cache_dir, make_records, plan_batches

SOURCE_NAME = "FlinkStateBench.java"
INSTALL_HINT = (
    "install a JDK 17+ (e.g. `apt-get install openjdk-17-jdk-headless`) and "
    "`pip install apache-flink-libraries==2.3.0` (its pyflink/lib has flink-dist-2.3.0.jar; "
    "or set COWMAP_FLINK_DIST_JAR=/path/to/flink-dist-2.3.0.jar)"
)
#: bytes per entry assumed when sizing the JVM heap (measured ~60-250 B/entry on Flink 2.3)
JVM_BYTES_PER_ENTRY = 300


def find_jar() -> Path | None:
    env = os.environ.get("COWMAP_FLINK_DIST_JAR")
    if env:
        return Path(env) if Path(env).is_file() else None
    try:
        spec = importlib.util.find_spec("pyflink")
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        jars = sorted(Path(root, "lib").glob("flink-dist-*.jar"))
        if jars:
            return jars[-1]
    return None


def find_source() -> Path | None:
    env = os.environ.get("COWMAP_FLINK_BENCH_SRC")
    candidates = [Path(env)] if env else []
    # a checkout (editable install: python/cowmap/bench/flink.py -> repo root), then the cwd
    candidates += [Path(__file__).resolve().parents[3] / "benches" / "flink" / SOURCE_NAME,
                   Path.cwd() / "benches" / "flink" / SOURCE_NAME]
    return next((p for p in candidates if p.is_file()), None)


def java_version(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2)) if major == 1 and m.group(2) else major


def check() -> tuple[dict | None, str]:
    """``(paths, "")`` when Flink can run, else ``(None, what is missing and how to install it)``."""
    java, javac = shutil.which("java"), shutil.which("javac")
    missing = []
    if not java or not javac:
        missing.append("a JDK (java and javac on PATH)")
    else:
        v = java_version(java)
        if v is None or v < 17:
            missing.append(f"Java 17 or newer (found {v or 'an unknown version'})")
    jar = find_jar()
    if jar is None:
        missing.append("flink-dist-*.jar (PyPI package apache-flink-libraries==2.3.0)")
    src = find_source()
    if src is None:
        missing.append(f"benches/flink/{SOURCE_NAME} (run from a cowmap checkout or set COWMAP_FLINK_BENCH_SRC)")
    if missing:
        return None, "--with-flink skipped: missing " + "; ".join(missing) + ". To get it: " + INSTALL_HINT + "."
    return {"java": java, "javac": javac, "jar": jar, "source": src}, ""


def compile_bench(paths: dict) -> Path:
    """Compiles the program (once per source + jar + JDK) and returns its classes directory."""
    src, jar = paths["source"], paths["jar"]
    h = hashlib.sha256(src.read_bytes())
    h.update(f"{jar.resolve()}:{jar.stat().st_size}:{paths['javac']}".encode())
    out = cache_dir() / "flink-bench" / h.hexdigest()[:16]
    if (out / "FlinkStateBench.class").is_file():
        return out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError:
        out = Path(tempfile.mkdtemp(prefix="cowmap-flink-bench-"))
    proc = subprocess.run([paths["javac"], "-nowarn", "-encoding", "UTF-8", "-cp", str(jar), "-d", str(out), str(src)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"compiling {src} against {jar} failed:\n{proc.stderr[-3000:]}")
    return out


def _heap_arg(st: Settings, batches: list[list[tuple[str, str]]]) -> str:
    biggest = max(len(b) for b in batches)
    want = biggest * st.total * JVM_BYTES_PER_ENTRY + (1 << 30)
    avail = available_memory()
    if avail:
        want = min(want, int(0.75 * avail))
    return f"-Xmx{max(want >> 20, 1024)}m"


def run_flink(st: Settings, paths: dict, on_progress: Callable[[str], None] | None = None
              ) -> tuple[list[dict], list[str]]:
    """Runs every sweep point x layout x TTL mode in one JVM; returns ``(rows, errors)``."""
    import json

    progress = on_progress or (lambda _text: None)
    classes = compile_bench(paths)
    batches = plan_batches(st, st.total, JVM_BYTES_PER_ENTRY)
    rows: list[dict] = []
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="cowmap-flink-") as tmp:
        lines = [f"ttl_ms {st.ttl_ms}", f"repeats {st.repeats}", f"min_records {st.min_records}",
                 f"round_budget_ms {st.round_budget_ms}", f"warmup_ms {st.flink_warmup_ms}"]
        for e, groups, users in st.points():
            f = Path(tmp, f"records-{e}.bin")
            make_records(st, e, groups).tofile(f)
            lines.append(f"point {e} {groups} {users} {st.records} {f}")
            lines += ["batch " + " ".join(f"{lay}:{mode}" for lay, mode in b) for b in batches]
        plan = Path(tmp, "plan.txt")
        plan.write_text("\n".join(lines) + "\n")
        cmd = [paths["java"], _heap_arg(st, batches), "-XX:+UseParallelGC", "-cp",
               f"{classes}{os.pathsep}{paths['jar']}", "FlinkStateBench", str(plan)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        tail: list[str] = []

        def read_err() -> None:
            for line in proc.stderr:  # type: ignore[union-attr]
                if line.startswith("PROGRESS "):
                    progress(line.split(" ", 2)[-1].strip())
                elif not line.startswith("SLF4J"):
                    tail.append(line)
                    del tail[:-40]

        t = threading.Thread(target=read_err, daemon=True)
        t.start()
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith("RESULT "):
                rows.append(json.loads(line[len("RESULT "):]))
        proc.wait()
        t.join()
        if proc.returncode != 0:
            errors.append(f"the Flink benchmark JVM exited with code {proc.returncode}:\n{''.join(tail)[-3000:]}")
    return rows, errors
