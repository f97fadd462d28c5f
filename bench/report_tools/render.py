"""The tables of README.md and docs/*.md, rendered from the results bench/report keeps in
docs/results/ (one JSON file per section, each stamped with the machine and the date).

A document asks for a table with a pair of markers; everything between them is replaced:

    <!-- report:allreduce-tcp -->
    ...generated...
    <!-- /report:allreduce-tcp -->

Pure standard library (no matplotlib), so that the docs check can re-render every table from the
committed results and fail when a document differs: tables are regenerated, never edited by hand.
"""
import difflib
import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "docs", "results")
PLOTS = os.path.join(ROOT, "docs", "plots")
MARKER = re.compile(r"<!-- report:([a-z0-9-]+) -->\n(.*?)<!-- /report:\1 -->", re.S)
SMALL = 1024  # sizes up to this are latency-bound: shown as times

LIB_NAMES = {"loom": "Loom", "gloo-ring": "Gloo ring", "gloo-hd": "Gloo h-d", "mpi-tcp": "Open MPI tcp",
             "mpi-shm": "Open MPI vader"}


# ---- formatting -------------------------------------------------------------------------------

def human(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def us(v):
    return f"{v:.1f} µs" if v < 100 else f"{v:.0f} µs"


def gbs(v):
    return f"{v:.2f}" if v >= 1 else f"{v:.3f}"


def ratio(v):
    return f"{v:.2f}×"


def pct(v):
    return f"{100 * v:.0f}%"


def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def load(name):
    path = os.path.join(RESULTS, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def rel(doc_dir, path):
    return os.path.relpath(path, doc_dir)


def stamp_line(res, doc_dir, section):
    s = res["stamp"]
    raw = rel(doc_dir, os.path.join(RESULTS, section + ".json"))
    return (f"*{s['date']}, {s['cpu']} ({s['cores']} cores), Linux {s['kernel']}, Loom {s['commit']}: "
            f"`{res['command']}`; raw results: [{os.path.basename(raw)}]({raw}).*\n")


def missing(section):
    return f"*Not measured yet: `bench/report --only {section}` measures it.*\n"


def stamped(result, section):
    """A renderer of one results file: `body(res_doc)` gives the table and its notes; the wrapper
    puts the stamp line above them, or says how to measure them when there are no results yet."""
    def wrap(body):
        def render(doc_dir):
            res_doc = load(result)
            if res_doc is None:
                return missing(section)
            return stamp_line(res_doc, doc_dir, result) + "\n" + body(res_doc)
        return render
    return wrap


# ---- all-reduce over TCP and shared memory ------------------------------------------------------

def rows_by(doc):
    """{(ranks, bytes, lib): (time_us, busbw)} and {(ranks, bytes, kind): gbs}."""
    res = {(r["ranks"], r["bytes"], r["lib"]): (r["time_us"], r["busbw_gbs"]) for r in doc["results"]}
    ceil = {(c["ranks"], c["bytes"], c["kind"]): c["gbs"] for c in doc["ceilings"]}
    return res, ceil


def cell(v, size):
    if v is None:
        return "—"
    return us(v[0]) if size <= SMALL else gbs(v[1])


def spread(doc, ranks, size, lib="loom"):
    """The slowest run's time over the fastest's, for the runs behind a median ("" when unknown)."""
    for r in doc["results"]:
        if r["ranks"] == ranks and r["bytes"] == size and r["lib"] == lib and len(r.get("runs_us", [])) > 1:
            return f"{max(r['runs_us']) / min(r['runs_us']):.2f}"
    return ""


def best_other(res, ranks, size, libs):
    """The best of `libs` at this point: (lib, (time, busbw)), by time up to SMALL, else by busbw."""
    have = [(lib, res[(ranks, size, lib)]) for lib in libs if (ranks, size, lib) in res]
    if not have:
        return None
    return min(have, key=lambda x: x[1][0]) if size <= SMALL else max(have, key=lambda x: x[1][1])


def vs(mine, other, size):
    """Loom against another library, > 1 where Loom is faster (time ratio up to SMALL, busbw above)."""
    if mine is None or other is None:
        return "—"
    return ratio(other[0] / mine[0]) if size <= SMALL else ratio(mine[1] / other[1])


@stamped("allreduce_tcp", "tcp")
def render_allreduce_tcp(res_doc):
    d = res_doc["data"]
    res, ceil = rows_by(d)
    out = []
    ranks = sorted({r["ranks"] for r in d["results"]})
    sizes = sorted({r["bytes"] for r in d["results"]})
    rows = []
    for n in ranks:
        for s in sizes:
            loom = res.get((n, s, "loom"))
            other = best_other(res, n, s, ("gloo-ring", "gloo-hd", "mpi-tcp"))
            raw = ceil.get((n, s, "raw"))
            rows.append([n, human(s), cell(loom, s), spread(d, n, s)] +
                        [cell(res.get((n, s, k)), s) for k in ("gloo-ring", "gloo-hd", "mpi-tcp")] +
                        [gbs(raw) if raw else "", vs(loom, other[1] if other else None, s),
                         pct(loom[1] / raw) if (loom and raw and s > SMALL) else "",
                         cell(res.get((n, s, "mpi-shm")), s)])
    out.append(table(["ranks", "size", "Loom", "Loom's spread", "Gloo ring", "Gloo h-d", "Open MPI tcp", "raw TCP ring",
                      "Loom vs best other", "Loom / raw", "Open MPI vader (reference)"], rows))
    out.append("\nbusbw in GB/s (time up to 1 KiB); medians of "
               f"{d['repeats']} runs ({d['small_repeats']} up to 1 KiB); \"Loom's spread\" is its slowest run's time "
               "over its fastest; \"Loom vs best other\" is Loom's busbw over the best of Gloo and Open MPI over TCP "
               "(up to 1 KiB the best other time over Loom's): above 1 Loom is faster.\n")
    return "".join(out)


def shm_table(res_doc):
    d = res_doc["data"]
    res, ceil = rows_by(d)
    out = []
    ranks = sorted({r["ranks"] for r in d["results"]})
    sizes = sorted({r["bytes"] for r in d["results"]})
    rows = []
    for n in ranks:
        for s in sizes:
            loom, mpi = res.get((n, s, "loom")), res.get((n, s, "mpi-shm"))
            bound = ceil.get((n, s, "bound")) if s > SMALL else None
            rows.append([n, human(s), cell(loom, s), spread(d, n, s), cell(mpi, s), vs(loom, mpi, s),
                         gbs(ceil[(n, s, "memcpy")]) if (n, s, "memcpy") in ceil and s > SMALL else "",
                         gbs(bound) if bound else "", pct(loom[1] / bound) if (loom and bound) else ""])
    out.append(table(["ranks", "size", "Loom", "Loom's spread", "Open MPI vader", "Loom vs Open MPI",
                      "memcpy per thread", "bound", "Loom / bound"], rows))
    out.append(f"\n{d['coll']}, float32; busbw in GB/s (time up to 1 KiB); medians of {d['repeats']} runs "
               f"({d['small_repeats']} up to 1 KiB); \"Loom's spread\" is its slowest run's time over its fastest. "
               "The bound is the memory traffic of Loom's algorithm at the memcpy rate measured in the same run "
               "(see below).\n")
    return "".join(out)


render_allreduce_shm = stamped("allreduce_shm", "shm")(shm_table)


def render_shm_colls(doc_dir):
    parts = []
    for coll in ("broadcast", "allgather"):
        if load(f"{coll}_shm") is None:
            return missing("shm-colls")
        parts.append(f"**{'Broadcast' if coll == 'broadcast' else 'All-gather'}**\n\n")
        parts.append(stamped(f"{coll}_shm", "shm-colls")(shm_table)(doc_dir))
        parts.append("\n")
    return "".join(parts).rstrip("\n") + "\n"


def render_readme(doc_dir):
    tcp, shm = load("allreduce_tcp"), load("allreduce_shm")
    if tcp is None or shm is None:
        return missing("tcp,shm")
    rt, ct = rows_by(tcp["data"])
    rs, _ = rows_by(shm["data"])
    n = 4
    sizes = [s for s in (8, 1024, 65536, 1 << 20, 16 << 20, 64 << 20) if (n, s, "loom") in rt]
    rows = []
    for s in sizes:
        lt, other = rt.get((n, s, "loom")), best_other(rt, n, s, ("gloo-ring", "gloo-hd", "mpi-tcp"))
        gloo = best_other(rt, n, s, ("gloo-ring", "gloo-hd"))
        ls, ms = rs.get((n, s, "loom")), rs.get((n, s, "mpi-shm"))
        raw = ct.get((n, s, "raw"))
        rows.append([human(s), cell(ls, s), cell(ms, s), vs(ls, ms, s), cell(lt, s), cell(gloo[1] if gloo else None, s),
                     cell(rt.get((n, s, "mpi-tcp")), s), vs(lt, other[1] if other else None, s),
                     pct(lt[1] / raw) if (lt and raw and s > SMALL) else ""])
    s = tcp["stamp"]
    out = [table(["size", "Loom shm", "Open MPI vader", "Loom vs Open MPI", "Loom TCP", "Gloo TCP (best)",
                  "Open MPI TCP", "Loom vs best other", "Loom / raw TCP"], rows)]
    out.append(f"\n4 ranks on one node ({s['cpu']}, {s['cores']} cores, {s['date']}); float32 sum; busbw in GB/s "
               f"(time up to 1 KiB), medians of {tcp['data']['repeats']} interleaved runs ({tcp['data']['small_repeats']} "
               "up to 1 KiB); \"vs\" columns above 1 mean Loom is faster. "
               f"Made by `bench/report`; method, every other table and what limits each row: "
               f"[docs/performance.md]({rel(doc_dir, os.path.join(ROOT, 'docs', 'performance.md'))}).\n")
    return "".join(out)


# ---- across nodes -------------------------------------------------------------------------------

NODE_RATES = (("1gbit", "1 Gbit/s"), ("5gbit", "5 Gbit/s"), ("none", "unshaped veth"))


def node_runs(d):
    """bench/compare_nodes' figures as {lib: {bytes: (time_us, busbw)}}."""
    return {lib: {p["bytes"]: (p["time_us"], p["busbw_gbs"]) for p in pts} for lib, pts in d["runs"].items()}


def node_best_other(runs, size):
    """(lib, (time, busbw)) of the best of Gloo and Open MPI at `size`, or None."""
    others = [(lib, runs[lib][size]) for lib in ("gloo-ring", "gloo-hd", "mpi-tcp") if size in runs.get(lib, {})]
    if not others:
        return None
    return min(others, key=lambda x: x[1][0]) if size <= SMALL else max(others, key=lambda x: x[1][1])

@stamped("nodes", "nodes")
def render_nodes(res_doc):
    out = []
    rows = []
    for key, title in NODE_RATES:
        d = res_doc["data"].get(key)
        if not d:
            continue
        runs = node_runs(d)
        link, ring = d.get("link_gbs") if d.get("rate") else None, d.get("ring_gbs")
        ceiling = " ".join(x for x in (f"link {gbs(link)}" if link else "", f"ring {gbs(ring)}" if ring else "") if x)
        first = True
        for s in sorted(runs.get("loom", {})):
            loom, best = runs["loom"].get(s), node_best_other(runs, s)
            top = link or ring
            rows.append([title if first else "", ceiling if first else "", human(s)] +
                        [cell(runs.get(k, {}).get(s), s) for k in ("loom", "gloo-ring", "gloo-hd", "mpi-tcp")] +
                        [vs(loom, best[1] if best else None, s), pct(loom[1] / top) if (loom and top and s > SMALL) else ""])
            first = False
    out.append(table(["links", "ceiling (same run)", "size", "Loom", "Gloo ring", "Gloo h-d", "Open MPI tcp",
                      "Loom vs best other", "Loom / ceiling"], rows))
    out.append("\n4 virtual nodes of 1 rank (`tools/vcluster`), float32 sum, busbw in GB/s (time up to 1 KiB); "
               "\"Loom / ceiling\" is Loom's busbw over the link's rate (one iperf3 stream) where the links are "
               "shaped, else over the raw ring.\n")
    return "".join(out)


# ---- kernels, point-to-point, torch, DDP, faults, algorithms -------------------------------------

@stamped("kernels", "kernels")
def render_kernels(res_doc):
    d = res_doc["data"]
    out = []
    rows = []
    for r in d["rows"]:
        if r["type"] != "float32" and r["op"] != "sum":  # every op of one type, every type's sum
            continue
        rows.append([r["type"], r["op"], human(r["bytes"]), f"{r['gbs']:.1f}",
                     f"{r['memcpy_gbs']:.1f}" if r.get("memcpy_gbs") else "", pct(r["vs_memcpy"])
                     if r.get("vs_memcpy") else ""])
    out.append(table(["type", "op", "buffer", "GB/s", "memcpy GB/s (same buffers)", "vs memcpy"], rows))
    out.append(f"\n`a[i] = op(a[i], b[i])`, output bytes per second; kernels chosen at run time: **{d['isa']}**; "
               f"medians of {d['repetitions']} repetitions.\n")
    return "".join(out)


@stamped("sendrecv", "p2p")
def render_p2p(res_doc):
    out = []
    rows = []
    for r in res_doc["data"]["runs"]:
        rows.append([r["ranks"], us(r["small_us"]), f"{gbs(r['peak_gbs'])} ({human(r['peak_bytes'])})",
                     gbs(r["raw_tcp_gbs"]), pct(r["peak_gbs"] / r["raw_tcp_gbs"]), gbs(r["memcpy_gbs"]),
                     us(r["barrier_us"])])
    out.append(table(["ranks", "64 B send/recv", "peak send/recv", "raw TCP, same run", "peak / raw",
                      "memcpy, same run", "barrier"], rows))
    out.append(f"\nOver TCP (`LOOM_TRANSPORT=tcp`), every rank sending to the next and receiving from the previous "
               f"at once; busbw = algbw in GB/s; medians of {res_doc['data']['repeats']} runs.\n")
    return "".join(out)


@stamped("torch", "torch")
def render_torch(res_doc):
    out = []
    rows, ddp = [], []
    for run in res_doc["data"]:
        n = run["ranks"]
        for r in run["results"]:
            s = r["size"]

            def bw(t):
                return s / t / 1e9 * 2 * (n - 1) / n
            v = {k: (r[k] * 1e6, bw(r[k])) for k in ("loom", "loom-tcp", "gloo", "direct")}
            rows.append([n, human(s), cell(v["loom"], s), cell(v["loom-tcp"], s), cell(v["gloo"], s),
                         cell(v["direct"], s), vs(v["loom"], v["gloo"], s), vs(v["loom-tcp"], v["gloo"], s),
                         f"{(r['loom'] / r['direct'] - 1) * 100:+.0f}%"])
        if run.get("ddp"):
            d = run["ddp"]
            ddp.append([n, f"{d['params'] / 1e6:.1f} M", f"{d['loom'] * 1e3:.0f} ms", f"{d['gloo'] * 1e3:.0f} ms",
                        ratio(d["gloo"] / d["loom"])])
    out.append(table(["ranks", "size", "loom", "loom, TCP only", "gloo", "Loom without torch", "loom vs gloo",
                      "loom TCP vs gloo", "backend overhead"], rows))
    out.append("\n`torch.distributed.all_reduce` of float32 CPU tensors; busbw in GB/s (time up to 1 KiB); \"loom\" "
               "uses shared memory between the ranks of the node, \"loom, TCP only\" is forced onto TCP like Gloo; "
               "the overhead is the backend's time over Loom's own call on the same communicator.\n")
    if ddp:
        out.append("\n" + table(["ranks", "parameters", "DDP step on loom", "on gloo", "loom vs gloo"], ddp))
    return "".join(out)


@stamped("ddp_overlap", "ddp")
def render_ddp(res_doc):
    out = []
    rows = []
    for r in res_doc["data"]["runs"]:
        m = r["median"]
        rows.append([r["ranks"], f"{m['backward']:.0f} ms", f"{m['comm']:.0f} ms", f"{m['after']:.0f} ms",
                     f"{m['overlapped']:.0f} ms", f"{m['overlapped'] / max(m['backward'], m['comm']):.2f}",
                     f"{min(r['ratios']):.2f}–{max(r['ratios']):.2f}"])
    out.append(table(["ranks", "backward alone", "communication alone", "sync after backward", "overlapped",
                      "overlapped / max", "range over runs"], rows))
    out.append(f"\nA 100 M-parameter float32 model in 50 layers; medians of {res_doc['data']['repeats']} runs of "
               "`ddp_overlap` (each a median of 5 steps); 1.00 would hide all the communication behind the "
               "backward.\n")
    return "".join(out)


@stamped("faults", "faults")
def render_faults(res_doc):
    out = []
    rows = []
    for r in res_doc["data"]["rows"]:
        text = r["error"].replace("|", "\\|")
        if len(text) > 220:
            text = text[:220] + " …"
        t = (lambda v: f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.2f} s")
        rows.append([r["fault"], f"{t(r['first_s'])} / {t(r['last_s'])}", f"`{text}`" if text else ""])
    out.append(table(["fault", "first / last survivor", "the error a survivor gets"], rows))
    out.append(f"\n{res_doc['data']['ranks']} ranks as processes on this host; time from the fault to the error, "
               f"medians of {res_doc['data']['repeats']} runs.\n")
    return "".join(out)


# ---- scale ----------------------------------------------------------------------------------------

SCALE_ROWS = [("loom threads", "Loom, ranks as threads"), ("loom processes", "Loom, ranks as processes"),
              ("gloo threads", "Gloo full mesh, ranks as threads")]
SCALE_TCP_ROWS = [("loom threads tcp", "Loom over TCP, ranks as threads"),
                  ("loom processes tcp", "Loom over TCP, ranks as processes"),
                  ("gloo threads", "Gloo full mesh, ranks as threads")]


def ms(v):
    return "–" if v is None else (f"{v:.2f} ms" if v < 10 else f"{v:.0f} ms" if v < 10000 else f"{v / 1000:.1f} s")


@stamped("scale", "scale")
def render_scale(res_doc):
    d = res_doc["data"]
    by = {(r["row"], r["ranks"]): r for r in d["results"]}
    sizes = sorted({r["ranks"] for r in d["results"]})
    notes = []

    def scale_table(keys, first, second):
        rows = []
        for n in sizes:
            row = [str(n)]
            for key, _ in keys:
                r = by.get((key, n))
                if r is None:
                    row += ["", ""] if key == "gloo threads" else ["", "", "", ""]
                    continue
                if "failed" in r:
                    text = f"{n} ranks, {key}: {r['failed'][:200]}"
                    if text not in notes:  # Gloo's row is in both tables
                        notes.append(text)
                    row += [f"failed ({notes.index(text) + 1})"] + ([""] if key == "gloo threads" else ["", "", ""])
                    continue
                if key == "gloo threads":
                    row += [f"{ms(r['init_ms'])} / {ms(r['first_ms'])}", f"{r['links']:.0f} / {r['fds']:.0f}"]
                else:
                    init = ms(r["init_ms"])
                    if "init_last_ms" in r:
                        init += f" ({ms(r['init_last_ms'])})"
                    row += [init, ms(r["first_ms"]), ms(r["split_ms"]), f"{r['links']:.0f} / {r['fds']:.0f}"]
            if len(row) > 1 and any(row[1:]):
                rows.append(row)
        headers = ["N", f"{first}: init", "first all-reduce", f"split into {d['groups']}", "links / fds per rank",
                   f"{second}: init", "first all-reduce", f"split into {d['groups']}", "links / fds per rank",
                   "Gloo full mesh: init / first", "links / fds per rank"]
        return table(headers, rows) if rows else ""

    out = ["Default links (one node: shared memory between every pair, made at init up to 8 ranks, on first use "
           "above; an all-reduce within the node reads the ranks' direct areas in place, through no link):\n\n",
           scale_table(SCALE_ROWS, "Loom threads", "Loom processes")]
    tcp = scale_table(SCALE_TCP_ROWS, "Loom threads over TCP", "Loom processes over TCP")
    if tcp:
        out += ["\nEvery pair over TCP (`LOOM_TRANSPORT=tcp`, as between nodes: links made at init up to 8 ranks, "
                "on first use above):\n\n", tcp]
    out.append(f"\nMedians of {d['repeats']} runs on {d['cores']} cores; times are the slowest rank's; links are "
               "those a rank holds after init and a first all-reduce (processes: and a barrier before it); "
               "descriptors per rank are those opened by init and a first all-reduce (threads: the process's, divided by "
               "N; processes: the most any rank opened, the rank that serves the store holding a socket per rank). "
               "Processes start one after another (`loomrun` forks them in turn): their init is timed from each "
               "one's own start, the first one's waiting for the last to come, and in brackets from the last "
               "one's start. "
               "Gloo's init is its full-mesh connect; its first all-reduce is a ring.\n")
    torch_rows = []
    for n in sizes:
        t, tl, loom = by.get(("torch processes", n)), by.get(("torch loom processes", n)), by.get(("loom processes tcp", n))
        if t is None and tl is None:
            continue
        row = [str(n)]
        for key, r in (("torch processes", t), ("torch loom processes", tl)):
            if r is None:
                row += ["", "", "", ""]
            elif "failed" in r:
                notes.append(f"{n} ranks, {key}: {r['failed'][:200]}")
                row += [f"failed ({len(notes)})", "", "", ""]
            else:
                row += [ms(r["init_ms"]), ms(r["first_ms"]), ms(r["split_ms"]), f"{r['links']:.0f} / {r['fds']:.0f}"]
        ok = loom is not None and "failed" not in loom
        row += [ms(loom["init_ms"]) if ok else "", ms(loom["split_ms"]) if ok else ""]
        torch_rows.append(row)
    if torch_rows:
        out += [f"\nPyTorch (Debian's), ranks as processes, on its Gloo backend and on Loom's (`import loom_torch`; "
                "one node, so shared memory between every pair), beside Loom itself over TCP: "
                "`init_process_group` with `tcp://`, a first all-reduce, and "
                f"{d['groups']} `new_group` calls that cut the job as the split does (every rank calls each; with "
                "Gloo each group's members form its mesh, with Loom a group of the default group's communicator, "
                "`Communicator::group`). Both include PyTorch's own work: its store's connect, and a barrier "
                "through the store after each group. The clock starts once every rank has imported torch.\n\n",
                table(["N", "PyTorch Gloo: init", "first all-reduce", f"new_group × {d['groups']}",
                       "links / fds per rank", "PyTorch on Loom: init", "first all-reduce",
                       f"new_group × {d['groups']}", "links / fds per rank", "Loom processes over TCP: init",
                       f"split into {d['groups']}"], torch_rows)]
    for i, text in enumerate(notes, 1):
        out.append(f"\n({i}) `{text}`\n")
    return "".join(out)


# ---- reproducible mode --------------------------------------------------------------------------

@stamped("reproducible", "reproducible")
def render_reproducible(res_doc):
    d = res_doc["data"]
    out = []
    b = d.get("bits")
    if b:
        rows = [[human(r["size"]), str(r["distinct_0"]), str(r["distinct_1"])] for r in b["rows"]]
        rows.append(["first 256 elements, over the sizes from 1 KiB", str(b["prefix_distinct"]["0"]),
                     str(b["prefix_distinct"]["1"])])
        out.append(table(["size", "distinct results, default mode", "distinct results, reproducible"], rows))
        out.append(f"\nDistinct checksums of the result over {b['runs_per_mode']} runs per mode: "
                   f"layouts {', '.join(b['layouts'])} (1 node over shared memory, 1 node over TCP, virtual nodes "
                   f"of 2 and of 1 rank), each with LOOM_ALGO = {', '.join(b['algos'])}. One means the same bits "
                   "in every run.\n\n")
    s = d.get("speed")
    if s:
        rows = [[r["links"], human(r["size"]), us(r["default_us"]), us(r["reproducible_us"]), ratio(r["ratio"])]
                for r in s["rows"]]
        out.append(table(["links", "size", "default mode", "reproducible", "reproducible / default"], rows))
        out.append(f"\n{s['ranks']} ranks, float32 sum, out-of-place time; medians of {s['repeats']} interleaved "
                   "runs of each.\n")
    return "".join(out)


def render_algos(doc_dir):
    res_doc = load("algos")
    if res_doc is None:
        return missing("algos")
    return f"```\n{res_doc['data']['text'].rstrip()}\n```\n"


def render_behind(doc_dir):
    """Every row of the current results where Loom is more than 5% behind its anchor."""
    rows = []

    def ratio_of(mine, other, size):
        return other[0] / mine[0] if size <= SMALL else mine[1] / other[1]

    def scan(section, label, anchors):
        res_doc = load(section)
        if res_doc is None:
            return
        res, _ = rows_by(res_doc["data"])
        for (n, s, lib) in sorted(res):
            if lib != "loom":
                continue
            other = best_other(res, n, s, anchors)
            if other and ratio_of(res[(n, s, lib)], other[1], s) < 0.95:
                rows.append([label, n, human(s), LIB_NAMES.get(other[0], other[0]),
                             ratio(ratio_of(res[(n, s, lib)], other[1], s))])
    scan("allreduce_tcp", "all-reduce over TCP", ("gloo-ring", "gloo-hd", "mpi-tcp"))
    for section, label in (("allreduce_shm", "all-reduce, shared memory"), ("broadcast_shm", "broadcast, shared memory"),
                           ("allgather_shm", "all-gather, shared memory")):
        scan(section, label, ("mpi-shm",))
    nodes = load("nodes")
    for key, title in NODE_RATES:
        d = nodes["data"].get(key) if nodes else None
        if not d:
            continue
        runs = node_runs(d)
        for s, mine in sorted(runs.get("loom", {}).items()):
            other = node_best_other(runs, s)
            if other is None:
                continue
            lib, best = other
            if ratio_of(mine, best, s) < 0.95:
                rows.append([f"all-reduce across virtual nodes, {title}", "4 (one per node)", human(s), LIB_NAMES.get(lib, lib),
                             ratio(ratio_of(mine, best, s))])
    if not rows:
        return "Loom is level with or ahead of every anchor in every row of the current results.\n"
    return table(["where", "ranks", "size", "ahead of Loom", "Loom vs it"], rows)


RENDERERS = {
    "behind": render_behind,
    "readme-allreduce": render_readme,
    "allreduce-tcp": render_allreduce_tcp,
    "allreduce-shm": render_allreduce_shm,
    "shm-colls": render_shm_colls,
    "nodes": render_nodes,
    "kernels": render_kernels,
    "p2p": render_p2p,
    "torch": render_torch,
    "ddp": render_ddp,
    "faults": render_faults,
    "algos": render_algos,
    "scale": render_scale,
    "reproducible": render_reproducible,
}


def documents():
    docs = [os.path.join(ROOT, "README.md")]
    d = os.path.join(ROOT, "docs")
    docs += sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".md"))
    return docs


def render_text(path, text):
    """`text` with every marked block rendered anew; raises KeyError on an unknown marker."""
    doc_dir = os.path.dirname(path)

    def fill(m):
        name = m.group(1)
        if name not in RENDERERS:
            raise KeyError(f"{os.path.relpath(path, ROOT)}: unknown report marker {name!r} "
                           f"(known: {', '.join(sorted(RENDERERS))})")
        return f"<!-- report:{name} -->\n{RENDERERS[name](doc_dir)}<!-- /report:{name} -->"
    return MARKER.sub(fill, text)


def render_all(check=False):
    """Renders every document; with check, changes nothing and returns the diffs. Returns a list of
    (path, unified diff) for the documents that differ."""
    diffs = []
    for path in documents():
        with open(path) as f:
            old = f.read()
        new = render_text(path, old)
        if new != old:
            diffs.append((path, "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                             os.path.relpath(path, ROOT), "rendered"))))
            if not check:
                with open(path, "w") as f:
                    f.write(new)
    return diffs
