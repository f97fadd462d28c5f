"""What bench/compare and bench/compare_nodes share: sizes, the helpers' output, medians, rounds."""
import re
import statistics

SMALL = 1024  # sizes up to this are latency-bound: timed, not judged by busbw


def parse_size(s):
    """'64K' -> 65536; '8' -> 8."""
    mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def human(n):
    """65536 -> '64K'; sizes that are not whole KiB/MiB/GiB stay in bytes."""
    for unit, div in (("G", 1024 ** 3), ("M", 1024 ** 2), ("K", 1024)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def helper_args(sizes, iters_for):
    """The arguments of the Gloo and MPI helpers: BYTES ITERS per size (at least 4 bytes)."""
    args = []
    for s in sizes:
        args += [str(max(4, s)), str(iters_for(s))]
    return args


def parse_lines(out, tag):
    """The helpers' lines "TAG ... BYTES TIME_US BUSBW" (a launcher's "[rank]" prefix allowed):
    {bytes: (time_us, busbw)}."""
    rows = (re.sub(r"^\[\d+\]\s*", "", l).split() for l in out.splitlines())
    return {int(f[3]): (float(f[4]), float(f[5])) for f in rows if len(f) == 6 and f[0] == tag}


def median_pair(values):
    """Median time and median busbw of the runs that produced a figure (None: none did)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)


def rounds(repeats, small_repeats, sizes):
    """The sizes each interleaved round runs: every size in the first `repeats` rounds, then the
    latency-bound ones (<= 1 KiB) alone up to `small_repeats` rounds. A small size's time is set by
    where the scheduler puts the ranks' threads for the whole run (two modes here, up to 2x apart,
    for every library alike), so its median wants more runs; they cost a second or two each.
    Yields (round index, sizes)."""
    for i in range(max(repeats, small_repeats)):
        run_sizes = [s for s in sizes if i < repeats or s <= SMALL]
        if run_sizes:
            yield i, run_sizes
