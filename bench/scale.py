"""A thousand caches: N CompileCaches × 3 GPU pools created at once, until all 3N warm-up Jobs exist.

For each N (``--caches 100 300 1000``) the bench runs the real operator
(``compilecache operator --standalone -n NS``, a subprocess with its metrics on a free port) on a
fresh cluster whose Nodes carry 3 GPU products, so that each cache gets 3 warm-up Jobs. Once the
operator is up (one cache made before the window has its Jobs), it creates N CompileCaches at once
(``--threads`` clients) and measures:

- the seconds from the first create until all 3N warm-up Jobs exist, and until every cache has
  been seen ``Warming``;
- the API requests the operator made in that window, by verb and resource (the difference of its
  ``compilecache_api_requests_total`` before and after; kopf's own watches are not counted);
- the operator's CPU seconds in that window (utime + stime, ``/proc/PID/stat``) and its peak RSS
  (``VmHWM``); on the local cluster the emulator's CPU seconds too, to see which of the two works;
- the floor: on a fresh cluster holding the same N caches and Nodes, the same 3N Job manifests
  (``jobs.warmup_job``, as bench/reconcile.py builds them) created directly, one after another,
  by one client, in the same run. Then the ratio of the two, the seconds per cache, and at the
  end the growth of the seconds per cache from the smallest N to the largest.

The bench sees Jobs and caches through one watch per kind (a list, then a watch from its
resourceVersion, again after the server ends it), not by polling: a list of every Job each
half-second costs the server the whole collection each time (about T/0.5 × 1.5N Jobs serialised
over a run of T seconds), where the watch costs one event per Job, as the operator's own watch does.

Locally the cluster is the API emulator (``compilecache.local.server``), served by a process of its
own (``--serve-emulator``, started by the bench) that forgets served requests: the operator, the
emulator and the bench's client are three processes. The emulator is a single Python process that
answers one request at a time, and its cost per request grows with the objects it holds: a
label-selected list copies every object of the kind before it filters them (as an API server's
list from etcd reads them all, at Python's cost), and a create with owners looks at every object.
Its own work is part of every figure here, the floor's included (measured: it is most of the
CPU spent), so the local figures show how the operator's reads scale, not what a real API server
would answer in seconds (docs/benchmarks.md).

``--kubeconfig PATH --namespace NS`` runs the same against a real cluster instead. Nodes cannot be
made there: the cluster must have GPU Nodes labelled ``nvidia.com/gpu.present=true`` and
``nvidia.com/gpu.product`` (one warm-up Job per product and cache; the bench reads how many from
the Nodes, as the operator does), the CompileCache CRD installed, and no other compilecache
operator serving NS. The operator runs on this machine with the kubeconfig's credentials, serving
NS only. The Jobs are real, and the Job controller makes their pods, but none runs: the caches
share a claim the bench makes with a StorageClass that does not exist, so it never binds and the
pods stay Pending (no GPU is taken, no image pulled). After each run the bench deletes its caches
(their Jobs and pods go by ownerReference, and it waits for the Jobs to be gone) and the claim.
It refuses to start while caches of an earlier run are left in NS.

Usage: .venv/bin/python bench/scale.py [--caches 100 300 1000] [--threads 4] [--timeout 1800]
                                       [--kubeconfig PATH --namespace NS]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "tests")]

from compilecache.controller import jobs, kube, policy  # noqa: E402
from compilecache.controller.api import parse_spec  # noqa: E402
from compilecache.controller.pools import resolve_pools  # noqa: E402
from compilecache.local.cluster import free_port  # noqa: E402
from jaxhelpers import inherited_pythonpath  # noqa: E402
from specs import cache_spec, node  # noqa: E402

PRODUCTS = 3
NODES_PER_PRODUCT = 2
BENCH_LABEL = "compilecache.dev/bench"  # on the bench's caches: what a real cluster's clean-up deletes
CLAIM = "compilecache-bench-scale"
NO_STORAGE_CLASS = "compilecache-bench-unbound"  # no such class: the claim stays Pending, no pod runs
# One claim that every cache of the namespace may mount (its opt-in label), made by the bench: a claim the
# operator made for one cache is that cache's alone (a second cache sharing it fails: the policy's claims rule).
SPEC = cache_spec(storage={"pvc": {"claimName": CLAIM}})
STARTUP_SECONDS = 120.0  # the operator's imports, login and first watches, on a busy 2-core machine
WARMING_GRACE_SECONDS = 120.0  # after the last Job: every cache seen Warming, or the figure is left out
WATCH_SECONDS = 60  # the server ends each watch after this; the bench watches again from where it was
CONNECT_SECONDS = 5.0
JOBS, CACHES = kube.JOBS.plural, kube.COMPILECACHES.plural  # the kinds the bench watches


@dataclass(frozen=True)
class Cluster:
    """Where a run happens: a kubeconfig and a namespace; on the local cluster the emulator's process too."""

    kubeconfig: Path
    namespace: str
    emulator: subprocess.Popen[str] | None = None


def api_client(kubeconfig: Path) -> kubernetes.client.ApiClient:
    """An API client from a kubeconfig file (its credentials, its server), as the operator's own builds one."""
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = 16  # the creating threads and the watches, each on its connection
    return kubernetes.client.ApiClient(configuration)


def serve_emulator(folder: Path) -> None:
    """(``--serve-emulator``: the emulator's own process.) Serve until stdin closes; print the URL once up."""
    from compilecache.local.apiserver import KubeEmulator
    from compilecache.local.server import running_emulator

    # Served requests forgotten, as the local cluster does: kmock otherwise scans every request it has
    # served on each new one (apiserver.KubeEmulator.keep_requests), and that cost, not the operator's,
    # grew with N (measured: 59 of the emulator's 63 CPU seconds at 40 caches, in kmock's filters).
    with running_emulator(folder, KubeEmulator(keep_requests=False)) as runner:
        print(runner.url, flush=True)
        sys.stdin.read()  # the bench closes it (or dies): the emulator ends with it


@contextlib.contextmanager
def local_cluster(folder: Path) -> Iterator[Cluster]:
    """A fresh API emulator in its own process, holding the Nodes of ``PRODUCTS`` GPU products."""
    folder.mkdir(parents=True)
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve-emulator", str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=child_env(),
        text=True,
    )
    try:
        assert process.stdout is not None
        if not process.stdout.readline():  # the URL, once it serves; nothing if it died first
            raise RuntimeError(f"the API emulator did not start (exit status {process.wait(30)})")
        cluster = Cluster(folder / "kubeconfig", "default", process)
        client = kube.Client(api_client(cluster.kubeconfig))
        # kopf serves only the namespaces it finds among the cluster's (kopf/_core/reactor/observation.py).
        client.create(kube.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})
        for product in range(PRODUCTS):
            for index in range(NODES_PER_PRODUCT):
                client.create(kube.NODES, node(f"gpu-{product}-{index}", f"GPU-PRODUCT-{product}", 8))
        client.create(kube.PVCS, claim(), cluster.namespace)
        client.close()
        yield cluster
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def real_cluster(kubeconfig: Path, namespace: str) -> Iterator[Cluster]:
    """The user's cluster: refuse leftovers of an earlier run, and delete what this run made at the end."""
    client = kube.Client(api_client(kubeconfig))
    try:
        left = client.list(kube.COMPILECACHES, namespace, labels={BENCH_LABEL: None})
        if left:
            raise SystemExit(
                f"{len(left)} CompileCaches of an earlier run are left in {namespace}: "
                f"kubectl delete compilecaches -n {namespace} -l {BENCH_LABEL}"
            )
        made = client.get(kube.PVCS, CLAIM, namespace) is None
        if made:
            client.create(kube.PVCS, claim(), namespace)
        try:
            yield Cluster(kubeconfig, namespace)
        finally:
            clean_up(client, namespace)
            if made:
                client.delete(kube.PVCS, CLAIM, namespace)
    finally:
        client.close()


def claim() -> dict[str, Any]:
    """The claim the bench's caches share: of a StorageClass that does not exist, so no volume is ever made.

    The operator only needs the claim to exist (its StorageReady condition reads ``ClaimFound``, Bound or
    Pending), so the warm-up Jobs come all the same; on a real cluster their pods stay Pending.
    """
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM, "labels": {policy.CLAIM_OPT_IN_LABEL: "true", BENCH_LABEL: "scale"}},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": NO_STORAGE_CLASS,
        },
    }


def clean_up(client: kube.Client, namespace: str, timeout: float = 600.0) -> None:
    """Delete the bench's caches (their Jobs and pods go by ownerReference); wait until the Jobs are gone."""
    caches = client.list(kube.COMPILECACHES, namespace, labels={BENCH_LABEL: None})
    names = {cache["metadata"]["name"] for cache in caches}
    for name in sorted(names):
        client.delete(kube.COMPILECACHES, name, namespace)
    deadline = time.monotonic() + timeout
    while True:
        left = [
            job
            for job in client.list(kube.JOBS, namespace, labels={jobs.LABEL_CACHE: None})
            if job["metadata"].get("labels", {}).get(jobs.LABEL_CACHE) in names
        ]
        if not left:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{len(left)} Jobs of the bench's caches still exist {timeout:.0f} s after their deletion"
            )
        time.sleep(2.0)  # a real cluster's garbage collector works in the background: its pace, not ours


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This tree's package first on the child's ``PYTHONPATH``, the caller's entries kept."""
    return {**os.environ, "PYTHONPATH": inherited_pythonpath([ROOT / "operator"]), **(extra or {})}


def pools_per_cache(client: kube.Client) -> int:
    """How many warm-up Jobs a cache of ``SPEC`` gets here: its pools, found from the Nodes as the operator does."""
    return len(resolve_pools(parse_spec(SPEC), client.list(kube.NODES)))


def cache_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "compilecache.dev/v1alpha1",
        "kind": "CompileCache",
        "metadata": {"name": name, "labels": {BENCH_LABEL: "scale"}},
        "spec": SPEC,
    }


def create_caches(client: kube.Client, namespace: str, names: Sequence[str], threads: int) -> None:
    """Create the caches as fast as ``threads`` clients can (one connection each)."""
    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(lambda name: client.create(kube.COMPILECACHES, cache_body(name), namespace), names):
            pass


# --- watching: one list, then a watch from its resourceVersion, again when the server ends it ------


@dataclass
class Seen:
    """What the watches saw: per kind and value, when each object first came with it; a watch's failure."""

    names: set[tuple[str, str]] = field(default_factory=set)  # (kind, name) of each object counted
    times: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (kind, value) → when each came
    changed: threading.Condition = field(default_factory=threading.Condition)
    error: BaseException | None = None

    def add(self, kind: str, name: str, value: str, now: float) -> None:
        """An object seen (again: it counts once, at its first sighting)."""
        with self.changed:
            if (kind, name) not in self.names:
                self.names.add((kind, name))
                self.times.setdefault((kind, value), []).append(now)
                self.changed.notify_all()

    def failed(self, error: BaseException) -> None:
        with self.changed:
            self.error = error
            self.changed.notify_all()

    def wait(self, kind: str, values: set[str], each: int, timeout: float, what: str) -> tuple[int, float]:
        """Wait until ``each`` objects of ``kind`` with each of ``values`` came; their count, and when the last came.

        A clear error when they do not within ``timeout`` (saying how many came), or when a watch failed.
        """
        deadline = time.monotonic() + timeout
        with self.changed:
            while not all(len(self.times.get((kind, value), ())) >= each for value in values):
                if self.error is not None:
                    raise RuntimeError(f"waiting for {what}: {self.error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    done = sum(min(len(self.times.get((kind, value), ())), each) for value in values)
                    raise TimeoutError(f"{done} of {each * len(values)} {what} came within {timeout:.0f} s")
                self.changed.wait(left)
            return each * len(values), max(self.times[(kind, value)][each - 1] for value in values)


class CacheFailed(Exception):
    """A cache of the bench failed: no Job will come for it, and its status says why."""


def watch(
    api: kubernetes.client.ApiClient,
    path: str,
    labels: str,
    value: Callable[[Mapping[str, Any]], str | None],
    seen: Seen,
    stopped: threading.Event,
) -> threading.Thread:
    """A thread that tells ``seen`` the ``value`` of each object at ``path`` labelled ``labels``, until ``stopped``.

    The objects' kind in ``seen`` is the last part of ``path``; an exception from ``value`` ends the watch
    and is every waiter's error.
    """
    kind = path.rsplit("/", 1)[-1]

    def call(query: list[tuple[str, str]], read_seconds: float) -> Any:
        method, url, headers, body, post = api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=[("labelSelector", labels), *query],
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = api.call_api(method, url, headers, body, post, _request_timeout=(CONNECT_SECONDS, read_seconds))
        if not 200 <= response.status < 300:
            raise RuntimeError(f"{path}: HTTP {response.status} {response.read()[:300]!r}")
        return response.response  # urllib3's, unread: the client asks for no preloading (kubernetes/client/rest.py)

    def show(obj: Mapping[str, Any]) -> None:
        name, found = obj.get("metadata", {}).get("name"), value(obj)
        if isinstance(name, str) and found is not None:
            seen.add(kind, name, found, time.perf_counter())

    def run() -> None:
        version = ""
        try:
            while not stopped.is_set():
                if not version:
                    answer = json.loads(call([], 120.0).read())
                    for item in answer.get("items") or []:
                        show(item)
                    version = answer["metadata"]["resourceVersion"]
                query = [("watch", "true"), ("resourceVersion", version), ("allowWatchBookmarks", "true")]
                stream = call([*query, ("timeoutSeconds", str(WATCH_SECONDS))], WATCH_SECONDS + 30.0)
                for line in stream:  # one event per line (the API's watch encoding for JSON)
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":  # e.g. 410 Gone, a version too old: list again
                        version = ""
                        break
                    version = obj.get("metadata", {}).get("resourceVersion") or version
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        show(obj)
                    if stopped.is_set():
                        break
                stream.release_conn()
        except BaseException as exc:  # the waiting thread raises it
            seen.failed(exc)

    thread = threading.Thread(target=run, name=f"watch {path}", daemon=True)
    thread.start()
    return thread


def job_cache(obj: Mapping[str, Any]) -> str | None:
    """A warm-up Job's cache."""
    value = obj.get("metadata", {}).get("labels", {}).get(jobs.LABEL_CACHE)
    return value if isinstance(value, str) else None


def cache_warming(obj: Mapping[str, Any]) -> str | None:
    """A cache's name once its phase is ``Warming``; :class:`CacheFailed` once it is ``Failed``."""
    status, name = obj.get("status") or {}, obj["metadata"]["name"]
    if status.get("phase") == "Failed":
        raise CacheFailed(f"{name} Failed: {status.get('message')}")
    return name if status.get("phase") == "Warming" else None


# --- the operator's figures ------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (proc(5): fields 14 and 15 of ``/proc/PID/stat``, in clock ticks)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # from field 3 on: the name in parentheses may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    """A process's peak resident set (``VmHWM``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def api_requests(text: str) -> dict[tuple[str, str], float]:
    """``compilecache_api_requests_total`` by (verb, resource), from the text of ``/metrics``."""
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "compilecache_api_requests_total":
                counts[(sample.labels["verb"], sample.labels["resource"])] = sample.value
    return counts


def difference(before: Mapping[tuple[str, str], float], after: Mapping[tuple[str, str], float]) -> dict[str, int]:
    """The requests made between two scrapes, ``"verb resource"`` → count; none made, none listed."""
    made = {
        f"{verb} {resource}": round(count - before.get((verb, resource), 0.0))
        for (verb, resource), count in after.items()
    }
    return {key: count for key, count in sorted(made.items()) if count}


def scrape(port: int) -> dict[tuple[str, str], float]:
    """The operator's API requests so far."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy for 127.0.0.1
    with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        return api_requests(answer.read().decode())


@contextlib.contextmanager
def running_operator(cluster: Cluster, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """The real operator on the cluster, watching its namespace, its metrics on a free port; SIGTERM at the end."""
    port = free_port()
    command = [sys.executable, "-m", "compilecache.cli", "operator", "--standalone", "-n", cluster.namespace, "-q"]
    command += ["--metrics-port", str(port), "--metrics-addr", "127.0.0.1"]
    env = child_env({"KUBECONFIG": str(cluster.kubeconfig), "PYTHONUNBUFFERED": "1"})
    with log.open("wb") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        yield process, port
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- one N -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    """One N's figures; seconds count from the first create."""

    caches: int
    jobs: int
    create_seconds: float  # the N creates themselves
    jobs_seconds: float  # until the last warm-up Job was seen
    warming_seconds: float | None  # until every cache was seen Warming (None: not within the grace)
    requests: dict[str, int]
    cpu_seconds: float
    emulator_cpu_seconds: float | None
    rss_mib: float
    floor_seconds: float = float("nan")
    wall_seconds: float = float("nan")  # the whole N: both clusters, the operator's start, the floor

    @property
    def ratio(self) -> float:
        return self.jobs_seconds / self.floor_seconds

    @property
    def per_cache(self) -> float:
        return self.jobs_seconds / self.caches


def cache_names(caches: int) -> list[str]:
    return [f"scale-{index:04d}" for index in range(caches)]


def operator_run(cluster: Cluster, caches: int, threads: int, timeout: float, log: Path) -> Figures:
    """The operator's part of one N: create the caches at once, wait for every warm-up Job."""
    client = kube.Client(api_client(cluster.kubeconfig))
    watcher = api_client(cluster.kubeconfig)
    stopped = threading.Event()
    seen = Seen()
    emulator = cluster.emulator.pid if cluster.emulator is not None else None
    try:
        per_cache = pools_per_cache(client)
        if not per_cache:
            raise SystemExit(
                "no GPU pool discovered: Nodes need nvidia.com/gpu.present=true and nvidia.com/gpu.product"
            )
        watch(watcher, kube.JOBS.path(cluster.namespace), jobs.LABEL_CACHE, job_cache, seen, stopped)
        watch(watcher, kube.COMPILECACHES.path(cluster.namespace), BENCH_LABEL, cache_warming, seen, stopped)
        with running_operator(cluster, log) as (process, port):
            # Up once a first cache has its Jobs: imports, login and the first watches are behind it.
            # It stays, made before the window: its own passes in it are at most one per resync period.
            client.create(kube.COMPILECACHES, cache_body("scale-up"), cluster.namespace)
            try:
                seen.wait(JOBS, {"scale-up"}, per_cache, STARTUP_SECONDS, "warm-up Jobs of the first cache")
            except (TimeoutError, RuntimeError) as exc:
                raise RuntimeError(f"{exc}; the operator's log ends:\n{log_tail(log)}") from None
            before, cpu_before = scrape(port), cpu_seconds(process.pid)
            emulator_before = cpu_seconds(emulator) if emulator is not None else 0.0
            names = cache_names(caches)
            started = time.perf_counter()
            create_caches(client, cluster.namespace, names, threads)
            created = time.perf_counter()
            try:
                count, last_job = seen.wait(JOBS, set(names), per_cache, timeout, "warm-up Jobs")
            except (TimeoutError, RuntimeError) as exc:
                raise RuntimeError(f"{exc}; the operator's log ends:\n{log_tail(log)}") from None
            after, cpu_after = scrape(port), cpu_seconds(process.pid)
            emulator_after = cpu_seconds(emulator) if emulator is not None else 0.0
            rss = peak_rss_mib(process.pid)
            try:
                _, warmed = seen.wait(CACHES, set(names), 1, WARMING_GRACE_SECONDS, "caches Warming")
                last_warming: float | None = warmed
            except TimeoutError:
                last_warming = None
    finally:
        stopped.set()
        client.close()
        watcher.close()
    return Figures(
        caches=caches,
        jobs=count,
        create_seconds=created - started,
        jobs_seconds=last_job - started,
        warming_seconds=None if last_warming is None else last_warming - started,
        requests=difference(before, after),
        cpu_seconds=cpu_after - cpu_before,
        emulator_cpu_seconds=emulator_after - emulator_before if emulator is not None else None,
        rss_mib=rss,
    )


def floor_run(cluster: Cluster, caches: int, threads: int) -> float:
    """Seconds for the Job creates alone: the operator's manifests of the same caches, in turn, by one client."""
    client = kube.Client(api_client(cluster.kubeconfig))
    try:
        create_caches(client, cluster.namespace, cache_names(caches), threads)
        spec = parse_spec(SPEC)
        pools = resolve_pools(spec, client.list(kube.NODES))
        objs = client.list(kube.COMPILECACHES, cluster.namespace, labels={BENCH_LABEL: None})
        manifests = [jobs.warmup_job(obj, spec, pool) for obj in objs for pool in pools]
        started = time.perf_counter()
        for manifest in manifests:
            client.create(kube.JOBS, manifest, cluster.namespace)
        return time.perf_counter() - started
    finally:
        client.close()


def log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else ""


# --- the figures printed ---------------------------------------------------------------------------


def growth(rows: Sequence[Figures]) -> float:
    """Seconds per cache at the largest N over those at the smallest (1.0: linear in N)."""
    smallest, largest = min(rows, key=lambda row: row.caches), max(rows, key=lambda row: row.caches)
    return largest.per_cache / smallest.per_cache


COLUMNS = ["caches", "jobs", "create s", "jobs s", "warming s", "floor s", "ratio", "ms/cache"]
COLUMNS += ["requests", "lists", "CPU s", "emul. CPU s", "RSS MiB", "wall s"]


def table(rows: Sequence[Figures]) -> list[str]:
    """One line per N, under a header of :data:`COLUMNS`."""
    lines = [" ".join(f"{column:>11}" for column in COLUMNS)]
    for row in rows:
        lists = sum(count for key, count in row.requests.items() if key.startswith("list "))
        values = [row.caches, row.jobs, f"{row.create_seconds:.2f}", f"{row.jobs_seconds:.2f}"]
        values += ["-" if row.warming_seconds is None else f"{row.warming_seconds:.2f}", f"{row.floor_seconds:.2f}"]
        values += [f"{row.ratio:.2f}", f"{row.per_cache * 1000:.0f}", sum(row.requests.values()), lists]
        values += [f"{row.cpu_seconds:.2f}"]
        values += ["-" if row.emulator_cpu_seconds is None else f"{row.emulator_cpu_seconds:.2f}"]
        values += [f"{row.rss_mib:.0f}", f"{row.wall_seconds:.0f}"]
        lines.append(" ".join(f"{v:>11}" for v in values))
    return lines


def breakdown(row: Figures) -> str:
    return f"requests at {row.caches}: " + ", ".join(f"{key} {count}" for key, count in row.requests.items())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--caches", type=int, nargs="+", default=[100, 300, 1000], help="the Ns, one run each")
    parser.add_argument("--threads", type=int, default=4, help="clients creating the caches at once")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for one N's Jobs")
    parser.add_argument("--kubeconfig", type=Path, help="a real cluster's (default: a local API emulator)")
    parser.add_argument("--namespace", help="with --kubeconfig: the namespace to run in")
    parser.add_argument("--serve-emulator", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_emulator is not None:
        serve_emulator(args.serve_emulator)
        return
    if (args.kubeconfig is None) != (args.namespace is None):
        parser.error("--kubeconfig and --namespace go together")
    if min(args.caches) < 1 or args.threads < 1:
        parser.error("--caches and --threads must be positive")

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        for index, caches in enumerate(args.caches):

            def cluster(part: str, index: int = index) -> contextlib.AbstractContextManager[Cluster]:
                if args.kubeconfig is not None:
                    return real_cluster(args.kubeconfig, args.namespace)
                return local_cluster(Path(tmp) / f"{index}-{part}")

            began = time.perf_counter()
            with cluster("operator") as where:
                row = operator_run(where, caches, args.threads, args.timeout, Path(tmp) / f"{index}-operator.log")
            with cluster("floor") as where:
                floor = floor_run(where, caches, args.threads)
            row = dataclasses.replace(row, floor_seconds=floor, wall_seconds=time.perf_counter() - began)
            print(f"{caches} caches: {row.jobs} Jobs in {row.jobs_seconds:.1f} s, floor {floor:.1f} s", file=sys.stderr)
            rows.append(row)
    print("\n".join(table(rows)))
    for row in rows:
        print(breakdown(row))
    if len(rows) > 1:
        smallest, largest = min(row.caches for row in rows), max(row.caches for row in rows)
        print(f"seconds per cache grew {growth(rows):.2f}x from {smallest} to {largest} caches")


if __name__ == "__main__":
    main()
