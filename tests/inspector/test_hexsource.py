"""Hex sources and regions: bounded, clamped reads over the real mapping; a region map that names
every header field and tensor of a real file; bisect lookups."""

from __future__ import annotations

import numpy as np

from colibri.engine import Model
from colibri.inspection.hexsource import (BytesSource, FileSource, HexSource, MappedSource,
                                          Region, RegionIndex, regions_for)


def test_mapped_source_reads_the_file_bytes(tiny_model_path):
    path = tiny_model_path()
    data = path.read_bytes()
    source = MappedSource(Model.open(path))
    assert source.size() == len(data)
    assert source.read(100, 300) == data[100:400]


def test_reads_are_clamped_at_the_end():
    source = BytesSource(b"0123456789")
    assert source.read(8, 100) == b"89"
    assert source.read(10, 4) == b""
    assert source.read(-5, 3) == b"012"


def test_sources_satisfy_the_protocol(tiny_model_path):
    path = tiny_model_path()
    for source in (BytesSource(b"x"), MappedSource(Model.open(path)), FileSource(path)):
        assert isinstance(source, HexSource)


def test_mapped_source_keeps_the_mapping_after_close(tiny_model_path):
    path = tiny_model_path()
    model = Model.open(path)
    source = MappedSource(model)
    model.close()
    assert source.read(0, 4) == b"COLI"


def test_file_source_reads_the_end_of_a_large_sparse_file(tmp_path):
    path = tmp_path / "sparse.bin"
    size = 20 << 30
    with open(path, "wb") as handle:
        handle.truncate(size)
        handle.seek(size - 4)
        handle.write(b"TAIL")
    source = FileSource(path)
    assert source.size() == size
    assert source.read(size - 8, 64) == b"\0\0\0\0TAIL"


def test_regions_name_each_tensor_data_range(tiny_model_path):
    model = Model.open(tiny_model_path())
    index = RegionIndex(regions_for(model))
    for t in model.tensors:
        region = index.at(t.offset)
        assert region is not None and region.kind == "tensor"
        assert (region.start, region.length) == (t.offset, t.nbytes)
        assert region.label.startswith(t.name + " ")


def test_regions_name_header_fields_and_table_entries(tiny_model_path):
    model = Model.open(tiny_model_path())
    index = RegionIndex(regions_for(model))
    assert index.at(0x14).label.startswith("header.tensor_count")
    first = model.tensors[0]
    assert index.at(first.table_offset + 5).label == f"table[0]: {first.name}"
    routing = next(f.value for f in model.header_fields() if f.name == "routing_offset")
    entry = 128 if model.hparams.version == 2 else 32
    assert index.at(routing + model.routing(1).layer * entry + 3).kind == "routing"
    assert index.at(routing + model.routing(1).layer * entry + 3).label.startswith("routing[1]")


def test_regions_do_not_overlap_in_a_valid_file(tiny_model_path):
    regions = regions_for(Model.open(tiny_model_path("qwen2_moe")))
    ends = np.array([r.end for r in regions[:-1]])
    starts = np.array([r.start for r in regions[1:]])
    assert (starts >= ends).all()


def test_region_index_lookups():
    index = RegionIndex([Region(0, 10, "header", "a"), Region(20, 5, "tensor", "b"),
                         Region(2, 2, "header", "inner")])
    assert index.at(3).label == "inner"
    assert index.at(5).label == "a"
    assert index.at(15) is None
    assert index.at(24).label == "b"
    assert [r.label for r in index.in_range(5, 21)] == ["a", "b"]
    assert index.in_range(10, 20) == []


def test_inspection_models_import_without_qt():
    import subprocess
    import sys
    code = ("import sys; sys.modules['PySide6'] = None; sys.modules['pyqtgraph'] = None\n"
            "import colibri.inspection.hexsource, colibri.inspection.values\n"
            "import colibri.inspection.tensors, colibri.inspection.stats\n")
    subprocess.run([sys.executable, "-c", code], check=True)
