"""The io description (pipeline/iospec.py): read from manifests old and new, program names, and the one-line
errors `feeds` gives for a request's named inputs."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import iospec
from pipeline.errors import InputError

TWO = {"inputs": [{"name": "input_ids", "dtype": "int64", "shape": [-1, -1]},
                  {"name": "token_type_ids", "dtype": "int64", "shape": [-1, -1]}],
       "outputs": [{"name": "embedding", "dtype": "float32", "shape": [-1, 8]},
                   {"name": "logits", "dtype": "float32", "shape": [-1, 2], "role": "logits"}],
       "labels": ["neg", "pos"]}


def test_an_old_single_tensor_interface_reads_with_its_logits():
    """Written before public names led (`name` the program's, `alias` the public one): read once, here, and
    written back in today's layout (`name` public, `program_name` the program's)."""
    old = {"inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 1, 8, 8], "alias": "x"}],
           "outputs": [{"name": "fetch_name_0", "alias": "logits", "dtype": "float32", "shape": [-1, 10]}],
           "labels": [str(i) for i in range(10)], "preprocessing": {"kind": "image"}}
    desc = iospec.IO.from_interface(old)
    assert desc.logits().name == "fetch_name_0" and desc.logits().public == "logits"
    back = desc.to_interface()
    assert back["labels"] == old["labels"]
    assert back["inputs"] == [{"name": "x", "dtype": "float32", "shape": [-1, 1, 8, 8]}]
    assert back["outputs"] == [{"name": "logits", "dtype": "float32", "shape": [-1, 10], "program_name": "fetch_name_0",
                                "role": "logits"}]
    assert iospec.IO.from_interface(back) == desc


def test_an_old_two_output_interface_and_its_new_layout_read_alike():
    """The 2-in / 2-out model's export interface as written before (program names under `name`) and now:
    the same tensors, the engines' names and the public ones alike."""
    old = {"inputs": [{"name": "img", "alias": "img", "dtype": "float32", "shape": [-1, 1, 8, 8]},
                      {"name": "feat", "alias": "feat", "dtype": "float32", "shape": [-1, 4]}],
           "outputs": [{"name": "fetch_name_0", "alias": "embedding", "dtype": "float32", "shape": [-1, 16]},
                       {"name": "fetch_name_1", "alias": "logits", "dtype": "float32", "shape": [-1, 4],
                        "role": "logits"}]}
    desc = iospec.IO.from_interface(old)
    new = desc.to_interface()
    assert [o["name"] for o in new["outputs"]] == ["embedding", "logits"]
    assert [o.get("program_name") for o in new["outputs"]] == ["fetch_name_0", "fetch_name_1"]
    assert "fetch_name_0" not in str(new["inputs"]) and all("alias" not in t for t in new["inputs"] + new["outputs"])
    again = iospec.IO.from_interface(new)
    assert again == desc and again.logits().name == "fetch_name_1" and again.output("embedding").name == "fetch_name_0"
    with pytest.raises(InputError, match="at most one of program_name, alias"):
        iospec.IO.from_interface({**new, "outputs": [{**new["outputs"][0], "alias": "e"}, new["outputs"][1]]})


def test_program_names_keep_the_public_ones_as_aliases():
    prog = iospec.IO.from_interface(TWO).with_program_names(["input_ids", "token_type_ids"],
                                                            ["fetch_name_0", "fetch_name_1"], "program")
    assert [(t.name, t.public) for t in prog.outputs] == [("fetch_name_0", "embedding"), ("fetch_name_1", "logits")]
    assert prog.logits().name == "fetch_name_1" and prog.input("token_type_ids").public == "token_type_ids"
    assert prog.output("embedding").name == prog.output("fetch_name_0").name
    with pytest.raises(InputError, match="the program has 1 inputs and 2 outputs, the interface 2 and 2"):
        iospec.IO.from_interface(TWO).with_program_names(["input_ids"], ["a", "b"], "program")


@pytest.mark.parametrize("arrays, message", [
    ({"input_ids": np.zeros((2, 5), np.int64)}, "req: missing input 'token_type_ids'; the model takes "
                                                 "'input_ids', 'token_type_ids'"),
    ({"input_ids": np.zeros((2, 5), np.int64), "token_type_ids": np.zeros((2, 5), np.int64),
      "segment": np.zeros((2, 5), np.int64)}, "req: unknown input 'segment'; the model takes 'input_ids', "
                                              "'token_type_ids'"),
    ({"input_ids": np.zeros((2, 5), np.float32), "token_type_ids": np.zeros((2, 5), np.int64)},
     "req: input 'input_ids': expected int64, got float32"),
    ({"input_ids": np.zeros((2, 5, 1), np.int64), "token_type_ids": np.zeros((2, 5), np.int64)},
     "req: input 'input_ids': expected shape [N, ?], got [2, 5, 1]"),
    ({"input_ids": np.zeros((2, 5), np.int64), "token_type_ids": np.zeros((3, 5), np.int64)},
     "req: inputs 'input_ids' and 'token_type_ids' have batch sizes 2 and 3"),
])
def test_feeds_name_the_tensor_in_one_line(arrays, message):
    with pytest.raises(InputError) as e:
        iospec.IO.from_interface(TWO).feeds(arrays, "req")
    assert str(e.value) == message


def test_feeds_accept_public_names_and_convert_within_a_kind():
    prog = iospec.IO.from_interface({"inputs": [{"name": "x_0", "alias": "img", "dtype": "float32", "shape": [-1, 3]}],
                                     "outputs": [{"name": "fetch_name_0", "alias": "logits", "dtype": "float32",
                                                  "shape": [-1, 2]}]})
    got = prog.feeds({"img": np.arange(6, dtype=np.int32).reshape(2, 3)}, "req")
    assert list(got) == ["x_0"] and got["x_0"].dtype == np.float32 and got["x_0"].flags.c_contiguous
    with pytest.raises(InputError, match="input 'img': expected shape \\[N, 3\\], got \\[2, 4\\]"):
        prog.feeds({"img": np.zeros((2, 4), np.float32)}, "req")


@pytest.mark.parametrize("iface, message", [
    ({"inputs": [], "outputs": TWO["outputs"]}, "needs at least one input and one output"),
    ({"inputs": TWO["inputs"] * 2, "outputs": TWO["outputs"]}, "two inputs are named 'input_ids'"),
    ({"inputs": [{"name": "x", "dtype": "complex64", "shape": [-1]}], "outputs": TWO["outputs"]}, "a dtype of"),
    ({"inputs": [{"name": "x", "dtype": "float32", "shape": [4, 3]}], "outputs": TWO["outputs"]}, "-1 batch axis"),
])
def test_malformed_interfaces_are_refused(iface, message):
    with pytest.raises(InputError, match=message):
        iospec.IO.from_interface(iface)


def test_two_outputs_without_a_logits_role_name_the_key():
    no_role = {**TWO, "outputs": [{**o, "role": ""} for o in TWO["outputs"]]}
    no_role["outputs"][1]["name"] = "scores"
    with pytest.raises(InputError, match="0 outputs have the logits role \\(embedding, scores\\); set model.logits_output"):
        iospec.IO.from_interface(no_role).logits()
