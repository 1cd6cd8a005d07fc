"""The test process's own Spark JVM, watched after every test.

When it dies, every later test that touches Spark fails on a dead py4j gateway, each after its own
wait: a CI run of the suite went on for an hour that way until its time limit, and the death itself
left no trace. So the run stops at the first test after which the JVM is gone, saying how it ended
(its exit status: -9 is a SIGKILL, the kernel's OOM killer's among others; 52 is Spark's own exit
on OutOfMemoryError; 134 an abort) and what the machine looked like then (memory left, the largest
processes). A JVM that runs but no longer answers py4j (its gateway could not accept a connection:
out of file descriptors or threads) stops the run the same way, with its descriptors, threads and
limits."""

from __future__ import annotations

from pathlib import Path


def _gateway_process():
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    return getattr(gateway, "proc", None) if gateway is not None else None


def exit_status() -> int | None:
    """The exit status of this process's Spark JVM, None while it runs or if it never started."""
    proc = _gateway_process()
    return None if proc is None else proc.poll()


def unanswered() -> str | None:
    """Why this process's running Spark JVM does not answer a py4j call, or None (it answers, or no
    JVM was started)."""
    from pyspark import SparkContext

    proc = _gateway_process()
    if proc is None or proc.poll() is not None:
        return None
    try:
        SparkContext._jvm.java.lang.System.nanoTime()
    except Exception as exc:  # noqa: BLE001 - any failure of the round trip is the finding
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return None


def _jvm_resources(pid: int) -> str:
    """Open descriptors and threads of process `pid`, against its limits."""
    try:
        descriptors = len(list(Path(f"/proc/{pid}/fd").iterdir()))
        threads = next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if line.startswith("Threads:"))
        limits = [line for line in Path(f"/proc/{pid}/limits").read_text().splitlines()
                  if line.startswith(("Max open files", "Max processes"))]
    except OSError as exc:
        return f"(its resources could not be read: {exc})"
    return f"{descriptors} open descriptors, {threads} threads; " + "; ".join(" ".join(l.split()) for l in limits)


def _meminfo() -> dict[str, int]:
    values = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        values[name] = int(rest.split()[0])  # kB
    return values


def _processes() -> list[tuple[int, int, str]]:
    """(resident kB, pid, command line) of every process this user can read, kernel threads left out."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        rss = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        found.append((rss, int(entry.name), command or f"[{entry.name}]"))
    return sorted((p for p in found if p[0] > 0), reverse=True)


def report(status: int | None, unanswered_why: str | None = None) -> str:
    """What to say when the JVM has died with `status`, or runs but does not answer (`unanswered_why`)."""
    memory = _meminfo()
    processes = _processes()
    java = [p for p in processes if "java" in p[2].split(" ", 1)[0]]
    if status is None:
        pid = _gateway_process().pid
        state = f"runs (pid {pid}: {_jvm_resources(pid)}) but does not answer py4j: {unanswered_why}"
    else:
        state = f"exited with status {status}"
    lines = [f"the test process's Spark JVM {state}; "
             f"memory available {memory.get('MemAvailable', 0) // 1024} MiB of {memory.get('MemTotal', 0) // 1024} MiB, "
             f"{len(processes)} processes, {len(java)} of them java"]
    lines += [f"  {rss // 1024:>6} MiB  pid {pid}  {command[:160]}" for rss, pid, command in processes[:12]]
    crash_files = sorted(Path.cwd().glob("hs_err_pid*.log"))
    if crash_files:
        lines.append(f"  JVM crash files: {', '.join(map(str, crash_files))}")
    return "\n".join(lines)

