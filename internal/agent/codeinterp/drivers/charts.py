# cella's e2b/chart extraction: what a matplotlib figure shows, as the JSON
# E2B's code interpreter returns in result.chart (its e2b_charts package
# defines the shape; this is a reimplementation of that shape). The Python
# driver runs this file before its own code, in the same namespace.
import datetime as _dt
import re as _re
from decimal import Decimal as _Decimal, localcontext as _localcontext

_UNIT_RE = _re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def _round8(number):
    """number with 8 significant digits, as E2B rounds box and pie values."""
    d = _Decimal(str(number))
    with _localcontext() as ctx:
        ctx.prec = max(1, 8 - d.adjusted())
        return float(+d)


def _is_grid_line(line):
    x, y = line.get_xdata(), line.get_ydata()
    if len(x) != 2 or len(y) != 2:
        return False
    return bool(x[0] == x[1] or y[0] == y[1])


def _none_if_empty(s):
    return s if s else None


def _number(v):
    try:
        import numpy

        if isinstance(v, numpy.datetime64):
            return str(v.astype("datetime64[s]"))
    except ImportError:
        pass
    if isinstance(v, (_dt.date, _dt.datetime)):
        return v.isoformat()
    if isinstance(v, str):
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def _is_date_converter(conv):
    import matplotlib.dates as mdates

    kinds = tuple(k for k in (getattr(mdates, "_SwitchableDateConverter", None), mdates.DateConverter,
                              mdates.ConciseDateConverter) if k is not None)
    return isinstance(conv, kinds)


def _converter(axis):
    get = getattr(axis, "get_converter", None)
    return get() if callable(get) else getattr(axis, "converter", None)


def _base(ax, kind):
    return {"type": kind, "title": _none_if_empty(ax.get_title()), "elements": []}


def _chart2d(ax, kind):
    c = _base(ax, kind)
    c["x_label"] = _none_if_empty(ax.get_xlabel())
    c["y_label"] = _none_if_empty(ax.get_ylabel())
    for axis in ("x", "y"):
        unit = None
        label = c[axis + "_label"]
        if label:
            m = _UNIT_RE.search(label)
            if m:
                unit = m.group(1) or m.group(2)
        c[axis + "_unit"] = unit
    return c


def _swap_axes(c):
    c["x_label"], c["y_label"] = c["y_label"], c["x_label"]
    c["x_unit"], c["y_unit"] = c["y_unit"], c["x_unit"]


def _ticks(conv, ticks):
    if _is_date_converter(conv):
        import matplotlib.dates as mdates

        return [mdates.num2date(t).isoformat() for t in ticks]
    if len(ticks) and isinstance(ticks[0], (int, float)):
        return [float(t) for t in ticks]
    return list(ticks)


def _scale(conv, scale, ticks, labels):
    if _is_date_converter(conv):
        return "datetime"
    if scale != "linear":
        return scale
    # Ticks 0..n-1 whose labels are not their numbers: categories.
    for i, (tick, label) in enumerate(zip(ticks, labels)):
        if isinstance(tick, (int, float)) and tick == i and str(i) != label:
            continue
        return "linear"
    return "categorical"


def _point_chart(ax, kind):
    c = _chart2d(ax, kind)
    for axis, name in ((ax.xaxis, "x"), (ax.yaxis, "y")):
        conv = _converter(axis)
        labels = [t.get_text() for t in (ax.get_xticklabels() if name == "x" else ax.get_yticklabels())]
        ticks = _ticks(conv, ax.get_xticks() if name == "x" else ax.get_yticks())
        scale = ax.get_xscale() if name == "x" else ax.get_yscale()
        c[name + "_ticks"] = ticks
        c[name + "_tick_labels"] = labels
        c[name + "_scale"] = _scale(conv, scale, ticks, labels)
    return c


def _line_chart(ax):
    c = _point_chart(ax, "line")
    for line in ax.get_lines():
        if _is_grid_line(line):
            continue
        label = line.get_label()
        if label.startswith("_child"):
            label = "Line %d" % int(label[6:])
        points = [[_number(x), _number(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]
        c["elements"].append({"label": label, "points": points})
    return c


def _scatter_chart(ax):
    c = _point_chart(ax, "scatter")
    for coll in ax.collections:
        points = [[_number(x), _number(y)] for x, y in coll.get_offsets()]
        c["elements"].append({"label": coll.get_label(), "points": points})
    return c


def _bar_chart(ax):
    c = _chart2d(ax, "bar")
    for container in ax.containers:
        group = container.get_label()
        if group.startswith("_container"):
            group = "Group %d" % int(group[10:])
        heights = [r.get_height() for r in container]
        if all(h == heights[0] for h in heights):
            # Bars of one height: horizontal bars (barh), measured by width.
            _swap_axes(c)
            labels = [t.get_text() for t in ax.get_yticklabels()]
            values = [r.get_width() for r in container]
        else:
            labels = [t.get_text() for t in ax.get_xticklabels()]
            values = heights
        for label, value in zip(labels, values):
            c["elements"].append({"label": label, "group": group, "value": float(value)})
    return c


def _box_chart(ax):
    c = _chart2d(ax, "box_and_whisker")
    labels = [t.get_text() for t in ax.get_xticklabels()]
    boxes = []
    for label, patch in zip(labels, ax.patches):
        v = patch.get_path().vertices
        xs = [_round8(x) for x in v[:, 0]]
        ys = [_round8(y) for y in v[:, 1]]
        x, y = min(xs), min(ys)
        boxes.append({"x": x, "y": y, "label": label, "width": max(xs) - x, "height": max(ys) - y, "outliers": []})
    vertical = bool(boxes) and all(b["height"] == boxes[0]["height"] for b in boxes)
    if vertical:
        _swap_axes(c)
        for b in boxes:
            b["x"], b["y"] = b["y"], b["x"]
            b["width"], b["height"] = b["height"], b["width"]
    for line in ax.lines:
        xs = [_round8(x) for x in line.get_xdata()]
        ys = [_round8(y) for y in line.get_ydata()]
        if vertical:
            xs, ys = ys, xs
        if len(xs) == 1:  # a flier
            box = next((b for b in boxes if b["x"] <= xs[0] <= b["x"] + b["width"]), None)
            if box is None:
                continue
            box["outliers"].append(ys[0])
        if len(ys) != 2:
            continue
        box = next((b for b in boxes if b["x"] <= xs[0] <= xs[1] <= b["x"] + b["width"]), None)
        if box is None:
            continue
        if ys[0] == ys[1] and box["y"] <= ys[0] <= box["y"] + box["height"]:
            box["median"] = ys[0]
            continue
        lo, hi = min(ys), max(ys)
        if hi == box["y"]:
            box["whisker_lower"] = lo
        elif lo == box["y"] + box["height"]:
            box["whisker_upper"] = hi
    c["elements"] = [{
        "label": b["label"], "min": b["whisker_lower"], "first_quartile": b["y"], "median": b["median"],
        "third_quartile": b["y"] + b["height"], "max": b["whisker_upper"], "outliers": b["outliers"],
    } for b in boxes]
    return c


def _pie_chart(ax):
    c = _base(ax, "pie")
    for w in ax.patches:
        angle = abs(_round8(_Decimal(float(w.theta2)) - _Decimal(float(w.theta1))))
        c["elements"].append({"label": w.get_label(), "angle": angle, "radius": float(w.r)})
    return c


def _chart_kind(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge
    from matplotlib.text import Text

    children = getattr(ax, "_children", None)  # what the user added (matplotlib >= 3.5)
    if children is None:
        children = ax.get_children()
    objs = [o for o in children if not isinstance(o, Text)]
    if all(isinstance(o, Line2D) for o in objs):
        return "line"
    if all(isinstance(o, (PathPatch, Line2D)) for o in objs):
        return "box_and_whisker"
    objs = [o for o in objs if not (isinstance(o, Line2D) and _is_grid_line(o))]
    for kind, cls in (("scatter", PathCollection), ("pie", Wedge), ("bar", Rectangle)):
        if all(isinstance(o, cls) for o in objs):
            return kind
    return "unknown"


_CHARTS = {"line": _line_chart, "scatter": _scatter_chart, "bar": _bar_chart,
           "box_and_whisker": _box_chart, "pie": _pie_chart}


def _axes_chart(ax):
    kind = _chart_kind(ax)
    f = _CHARTS.get(kind)
    return f(ax) if f else _base(ax, kind)


def _figure_chart(fig):
    """fig's chart, or None for a figure without data."""
    axes = fig.get_axes()
    if not axes or not any(ax.has_data() for ax in axes):
        return None
    if len(axes) > 1:
        title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
        return {"type": "superchart", "title": title, "elements": [_axes_chart(ax) for ax in axes]}
    return _axes_chart(axes[0])
