"""The plots of README.md and docs/performance.md, drawn from docs/results/ into docs/plots/:
busbw against message size, one line per library and transport, the ceilings measured in the
same run as dotted lines. Needs matplotlib (Debian's python3-matplotlib, hence /usr/bin/python3).
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

import render  # noqa: E402

STYLE = {  # label: (colour, line style, marker)
    "Loom, shared memory": ("#1f5fbf", "-", "o"),
    "Loom, TCP": ("#1f5fbf", "--", "o"),
    "Open MPI, shared memory (vader)": ("#d62728", "-", "s"),
    "Open MPI, TCP": ("#d62728", "--", "s"),
    "Gloo ring, TCP": ("#2ca02c", "--", "^"),
    "Gloo halving-doubling, TCP": ("#8c564b", "--", "v"),
    "Loom": ("#1f5fbf", "-", "o"),
    "Open MPI tcp": ("#d62728", "--", "s"),
    "Gloo ring": ("#2ca02c", "--", "^"),
    "Gloo h-d": ("#8c564b", "--", "v"),
}


def size_label(x, _pos):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if x >= div:
            return f"{x / div:g}{unit}"
    return f"{x:g}"


def draw(path, title, lines, ceilings, subtitle):
    """lines: [(label, [(bytes, busbw)])]; ceilings: [(label, [(bytes, gbs)])] drawn dotted."""
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    for label, pts in lines:
        if not pts:
            continue
        colour, style, marker = STYLE.get(label, (None, "-", "."))
        xs, ys = zip(*sorted(pts))
        ax.plot(xs, ys, style, color=colour, marker=marker, markersize=4, label=label)
    for label, pts in ceilings:
        if pts:
            xs, ys = zip(*sorted(pts))
            ax.plot(xs, ys, ":", color="grey", marker="x", markersize=4, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(size_label))
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title, fontsize=11)
    ax.text(0.0, -0.18, subtitle, transform=ax.transAxes, fontsize=7, color="grey")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def subtitle(res):
    s = res["stamp"]
    return f"{s['cpu']}, {s['cores']} cores, Linux {s['kernel']}, {s['date']}, Loom {s['commit']} (bench/report)"


def draw_allreduce(ranks):
    tcp, shm = render.load("allreduce_tcp"), render.load("allreduce_shm")
    if tcp is None or shm is None:
        return None

    def pts(doc, lib):
        return [(r["bytes"], r["busbw_gbs"]) for r in doc["data"]["results"]
                if r["ranks"] == ranks and r["lib"] == lib and r["busbw_gbs"] > 0]
    lines = [("Loom, shared memory", pts(shm, "loom")), ("Open MPI, shared memory (vader)", pts(shm, "mpi-shm")),
             ("Loom, TCP", pts(tcp, "loom")), ("Open MPI, TCP", pts(tcp, "mpi-tcp")),
             ("Gloo ring, TCP", pts(tcp, "gloo-ring")), ("Gloo halving-doubling, TCP", pts(tcp, "gloo-hd"))]
    raw = [(c["bytes"], c["gbs"]) for c in tcp["data"]["ceilings"] if c["ranks"] == ranks and c["kind"] == "raw"]
    return draw(os.path.join(render.PLOTS, f"allreduce_{ranks}ranks.png"),
                f"all-reduce, float32 sum, {ranks} ranks on one node", lines,
                [("raw TCP ring (no library)", raw)], subtitle(tcp))


def draw_nodes(rate, title):
    res = render.load("nodes")
    if res is None or rate not in res["data"]:
        return None
    d = res["data"][rate]
    lines = [(render.LIB_NAMES.get(lib, lib),
              [(p["bytes"], p["busbw_gbs"]) for p in pts if p["busbw_gbs"] > 0]) for lib, pts in d["runs"].items()]
    sizes = sorted({p["bytes"] for pts in d["runs"].values() for p in pts})
    ceilings = []
    if d.get("rate") and d.get("link_gbs"):
        ceilings.append(("link (one iperf3 stream)", [(s, d["link_gbs"]) for s in sizes]))
    if d.get("ring_gbs"):
        ceilings.append(("raw TCP ring", [(s, d["ring_gbs"]) for s in sizes]))
    return draw(os.path.join(render.PLOTS, f"allreduce_nodes_{rate}.png"),
                f"all-reduce across 4 virtual nodes, {title}", lines, ceilings, subtitle(res))


def draw_scale():
    """Init time and links per rank against the world size, Loom beside Gloo's full mesh."""
    res = render.load("scale")
    if res is None:
        return None
    rows = [("loom threads", "Loom, ranks as threads (shared memory)", "#1f5fbf", "-"),
            ("loom processes", "Loom, ranks as processes (shared memory)", "#1f5fbf", "--"),
            ("loom threads tcp", "Loom over TCP, ranks as threads", "#d62728", "-"),
            ("loom processes tcp", "Loom over TCP, ranks as processes", "#d62728", "--"),
            ("gloo threads", "Gloo full mesh, ranks as threads", "#2ca02c", "-"),
            ("torch processes", "PyTorch's Gloo backend, ranks as processes", "#2ca02c", ":"),
            ("torch loom processes", "PyTorch on Loom's backend, ranks as processes", "#1f5fbf", ":")]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.4), dpi=110)
    for key, label, colour, style in rows:
        pts = sorted((r["ranks"], r["init_ms"], r["links"]) for r in res["data"]["results"]
                     if r["row"] == key and "failed" not in r)
        if not pts:
            continue
        ns, init, links = zip(*pts)
        left.plot(ns, [t / 1000 for t in init], style, color=colour, marker="o", markersize=4, label=label)
        right.plot(ns, links, style, color=colour, marker="o", markersize=4, label=label)
    for ax, ylabel in ((left, "init time (s)"), (right, "links per rank")):
        ax.set_xscale("log", base=2)
        if ax is left:
            ax.set_yscale("log")
            ax.set_ylim(bottom=ax.get_ylim()[0] / 12)  # room for the legend below the lines
        else:  # linear near zero: a node's all-reduce that reads in place holds no link
            ax.set_yscale("symlog", linthresh=1)
            ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1) * 40)  # room for the legend
        ax.set_xlabel("ranks (N)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right" if ax is left else "upper right")
    left.set_title("time to initialise a communicator", fontsize=10)
    right.set_title("links each rank holds after a first all-reduce", fontsize=10)
    fig.text(0.01, 0.01, subtitle(res), fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path = os.path.join(render.PLOTS, "scale.png")
    fig.savefig(path)
    plt.close(fig)
    return path


def draw_all():
    os.makedirs(render.PLOTS, exist_ok=True)
    made = [draw_allreduce(4), draw_allreduce(2), draw_nodes("1gbit", "1 Gbit/s links"),
            draw_nodes("5gbit", "5 Gbit/s links"), draw_nodes("none", "unshaped links"), draw_scale()]
    return [p for p in made if p]
