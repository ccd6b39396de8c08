#!/usr/bin/env python3
"""The Parquet fixtures of tests/test_finetune_data.cpp, written by pyarrow as the Hub's
datasets are (one table, missing fields null, several row groups).

  ~/.cache/ndtrain/arrow-venv/bin/python tests/data/rows/make_parquet.py   # rewrites them here
"""
import os

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
message = pa.struct([("role", pa.string()), ("content", pa.string())])
schema = pa.schema([("text", pa.string()), ("id", pa.int64()), ("prompt", pa.string()),
                    ("completion", pa.string()), ("source", pa.string()), ("messages", pa.list_(message))])


def table(rows):
    return pa.Table.from_pylist([{k: r.get(k) for k in schema.names} for r in rows], schema=schema)


# the rows of EachRowFormatGivesItsTokensMasksAndDocumentStarts's formats.jsonl, two row groups
formats = [
    {"text": "the cat", "id": 7},
    {"prompt": "the ", "completion": "hat", "source": "x"},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
    {"text": "the end of the data"},
]
pq.write_table(table(formats), os.path.join(HERE, "formats.parquet"), row_group_size=2)
# a bad second row: a role the template does not know
bad = [{"text": "the cat"}, {"messages": [{"role": "wizard", "content": "hi"}]}, {"text": "the hat"}]
pq.write_table(table(bad), os.path.join(HERE, "bad_role.parquet"))
