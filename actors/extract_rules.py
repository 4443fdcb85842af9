"""Rule-based extraction: structured attributes and a product key from a title.

Tuned for computer parts (memory, drives, graphics cards, processors), the
pipeline's first use; anything else still gets brand, condition and quantity,
and a product key from its significant words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

BRANDS = (
    "corsair", "g.skill", "gskill", "kingston", "crucial", "micron", "samsung", "sk hynix", "hynix",
    "teamgroup", "team group", "patriot", "adata", "pny", "western digital", "wd", "seagate", "toshiba",
    "sandisk", "intel", "amd", "nvidia", "asus", "msi", "gigabyte", "evga", "zotac", "sapphire", "xfx",
    "hp", "hpe", "dell", "lenovo", "supermicro", "apple", "sony", "lg", "hgst", "sabrent", "lexar",
)
_BRAND_CANON = {"gskill": "g.skill", "team group": "teamgroup", "hynix": "sk hynix", "wd": "western digital"}

_CONDITIONS = (
    ("for parts", ("for parts", "not working", "broken", "as-is", "as is")),
    ("refurbished", ("refurbished", "refurb", "renewed", "recertified")),
    ("open box", ("open box", "open-box")),
    ("used", ("used", "pre-owned", "preowned", "pulled", "tested working")),
    ("new", ("brand new", "new sealed", "sealed", "bnib", "new")),
)

# In order of precedence: the first that matches wins.
_FORM_FACTORS = (
    (re.compile(r"\b(so-?dimm|laptop)\b"), "sodimm"),
    (re.compile(r"\b(ecc|rdimm|registered)\b"), "rdimm"),
    (re.compile(r"\bm\.2\b|\bnvme\b"), "m.2"),
    (re.compile(r'\b2\.5\s*(?:"|in\b|inch)'), "2.5in"),
    (re.compile(r'\b3\.5\s*(?:"|in\b|inch)'), "3.5in"),
)
_INTERFACES = (
    (re.compile(r"\bnvme\b"), "nvme"),
    (re.compile(r"\bsata\b"), "sata"),
    (re.compile(r"\bsas\b"), "sas"),
)
_CAPACITY = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*(tb|gb)\b", re.I)
_KIT = re.compile(r"(?<![\w.])(\d{1,2})\s*[x×]\s*(\d+)\s*(tb|gb)\b", re.I)
_KIT_SUFFIX = re.compile(r"(?<![\w.])(\d+)\s*(gb)\s*[x×]\s*(\d{1,2})\b", re.I)
_LOT = re.compile(r"\b(?:lot|pack|set)\s+of\s+(\d{1,3})\b|\b(\d{1,3})\s*-?\s*(?:pack|pcs|pieces|units)\b", re.I)
_DDR = re.compile(r"\b(?:lp)?ddr\s?([2-5])\b", re.I)
_DDR_SPEED = re.compile(r"\b(?:lp)?ddr\s?[2-5][\s-]*(\d{3,4})\b", re.I)
_MHZ = re.compile(r"\b(\d{3,4})\s*(?:mhz|mt/s)\b", re.I)
_PC_SPEED = re.compile(r"\bpc([2-5])-?(\d{4,5})\b", re.I)
_RPM = re.compile(r"\b(5400|5900|7200|10000|10k|15000|15k)\s*(?:rpm)?\b", re.I)
_GPU = re.compile(r"\b(rtx|gtx|rx|arc)\s*-?\s*([a-z]?\d{3,4})\s*(ti|super|xt|xtx)?\b", re.I)
_CPU = re.compile(r"\b(?:(i[3579])[\s-]+(\d{4,5}[a-z]{0,2})|ryzen\s+([3579])\s+(\d{4}[a-z0-9]{0,3})"
                  r"|(xeon)\s+(?:[a-z]+\s+)?([ew]?-?\d{4}[a-z]?(?:\s*v\d)?))\b", re.I)

# DDR4-3200 is also sold as PC4-25600 (bandwidth = 8 x transfer rate, rounded).
_JEDEC_SPEEDS = (800, 1066, 1333, 1600, 1866, 2133, 2400, 2666, 2933, 3200, 3600, 4000, 4400, 4800, 5200,
                 5600, 6000, 6400, 7200, 8000)
_STOP = {"the", "a", "an", "and", "or", "with", "for", "of", "in", "new", "used", "free", "shipping", "fast",
         "lot", "pack", "set", "x", "w", "-", "&", "+"}


@dataclass(frozen=True)
class Extraction:
    attributes: dict[str, Any]
    product_key: str | None
    quantity: int = 1
    extractor: str = "rules"
    notes: list[str] = field(default_factory=list, compare=False)


def _brand(text: str) -> str | None:
    for brand in BRANDS:
        if re.search(rf"(?<![\w.]){re.escape(brand)}(?![\w])", text):
            return _BRAND_CANON.get(brand, brand)
    return None


def _condition(text: str, stated: str | None) -> str | None:
    for source in (stated or "", text):
        low = source.lower()
        for name, words in _CONDITIONS:
            if any(re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", low) for w in words):
                return name
    return None


def _gb(amount: str, unit: str) -> float:
    value = float(amount)
    return value * 1000 if unit.lower() == "tb" else value


def _fmt_gb(gb: float) -> str:
    if gb >= 1000 and gb % 1000 == 0:
        return f"{int(gb // 1000)}tb"
    return f"{gb:g}gb"


def _component(text: str, attrs: dict[str, Any]) -> str | None:
    if attrs.get("memory_type") or re.search(r"\b(ram|dimm|sodimm|so-dimm|rdimm|udimm|memory)\b", text):
        return "ram"
    if re.search(r"\b(nvme|m\.2|ssd|solid state)\b", text):
        return "ssd"
    if attrs.get("rpm") or re.search(r"\b(hdd|hard drive|hard disk|sata hdd)\b", text):
        return "hdd"
    if attrs.get("gpu_model") or re.search(r"\b(graphics card|gpu|video card)\b", text):
        return "gpu"
    if attrs.get("cpu_model") or re.search(r"\b(cpu|processor)\b", text):
        return "cpu"
    return None


def extract(title: str, description: str | None = None, condition: str | None = None) -> Extraction:
    text = " ".join(filter(None, [title, description or ""])).lower()
    head = title.lower()
    attrs: dict[str, Any] = {}
    notes: list[str] = []

    if brand := _brand(head) or _brand(text):
        attrs["brand"] = brand
    if cond := _condition(head, condition):
        attrs["condition"] = cond

    modules = 1
    kit = _KIT.search(head)
    kit_suffix = _KIT_SUFFIX.search(head)
    if kit:
        modules = int(kit.group(1))
        attrs["module_gb"] = _gb(kit.group(2), kit.group(3))
        attrs["capacity_gb"] = attrs["module_gb"] * modules
    elif kit_suffix:
        modules = int(kit_suffix.group(3))
        attrs["module_gb"] = _gb(kit_suffix.group(1), kit_suffix.group(2))
        attrs["capacity_gb"] = attrs["module_gb"] * modules
    elif cap := _CAPACITY.search(head):
        attrs["capacity_gb"] = _gb(cap.group(1), cap.group(2))
    if modules > 1:
        attrs["modules"] = modules

    lot = _LOT.search(text)
    quantity = int(lot.group(1) or lot.group(2)) if lot else 1
    if quantity > 1:
        attrs["quantity"] = quantity

    if ddr := _DDR.search(head):
        attrs["memory_type"] = f"ddr{ddr.group(1)}"
    pc = _PC_SPEED.search(head)
    if pc and "memory_type" not in attrs:
        attrs["memory_type"] = f"ddr{pc.group(1)}"
    if speed := _DDR_SPEED.search(head) or _MHZ.search(head):
        attrs["speed_mts"] = int(speed.group(1))
    elif pc:
        attrs["speed_mts"] = min(_JEDEC_SPEEDS, key=lambda v: abs(v - int(pc.group(2)) / 8))
    if form_factor := _first_match(_FORM_FACTORS, text):
        attrs["form_factor"] = form_factor
    if rpm := _RPM.search(head):
        value = rpm.group(1).lower()
        attrs["rpm"] = {"10k": 10000, "15k": 15000}.get(value, int(value) if value.isdigit() else value)
    if interface := _first_match(_INTERFACES, text):
        attrs["interface"] = interface
    if gpu := _GPU.search(head):
        attrs["gpu_model"] = "".join(p.lower() for p in gpu.groups() if p)
    if cpu := _CPU.search(head):
        attrs["cpu_model"] = "-".join(p.lower().replace(" ", "") for p in cpu.groups() if p)

    component = _component(text, attrs)
    if component:
        attrs["component"] = component
    key = product_key(attrs, title)
    if key is None:
        notes.append("not enough attributes for a product key")
    return Extraction(attrs, key, quantity, "rules", notes)


def _first_match(table: tuple[tuple[re.Pattern[str], str], ...], text: str) -> str | None:
    """The value of the first pattern that matches (the tables are in order of precedence)."""
    return next((value for pattern, value in table if pattern.search(text)), None)


# A part of a key the listing did not give: such a key is kept (its listing is still priced
# among the other unknowns) but counts as incomplete, so it is extracted again
# (listing_extraction_incomplete, migration 104). A default in its place priced NVMe drives
# against SATA ones.
UNKNOWN = "?"


def product_key(attrs: dict[str, Any], title: str) -> str | None:
    """Listings with the same key are priced against each other."""
    component = attrs.get("component")
    cap = attrs.get("capacity_gb")
    if component == "ram" and cap:
        parts = ["ram", attrs.get("memory_type", f"ddr{UNKNOWN}"), _fmt_gb(cap), str(attrs.get("speed_mts") or UNKNOWN)]
        if attrs.get("form_factor") in ("sodimm", "rdimm"):
            parts.append(attrs["form_factor"])
        return ":".join(parts)
    if component == "ssd" and cap:
        return ":".join(["ssd", attrs.get("interface") or UNKNOWN, _fmt_gb(cap)])
    if component == "hdd" and cap:
        parts = ["hdd", _fmt_gb(cap)]
        if attrs.get("rpm"):
            parts.append(str(attrs["rpm"]))
        return ":".join(parts)
    if component == "gpu" and attrs.get("gpu_model"):
        return f"gpu:{attrs['gpu_model']}"
    if component == "cpu" and attrs.get("cpu_model"):
        return f"cpu:{attrs['cpu_model']}"
    words = [w for w in re.findall(r"[a-z0-9]+(?:\.[0-9]+)?", title.lower()) if w not in _STOP]
    if len(words) < 2:
        return None
    brand = attrs.get("brand", "").replace(" ", "")
    rest = [w for w in words if w != brand][:4]
    return ":".join(["item", brand or "-", *rest])
