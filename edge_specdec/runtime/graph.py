"""Graph surgery on an exported model, before it is compiled: the logits computed only for the rows and token ids
a caller needs, and copies with static token shapes."""
from __future__ import annotations

from collections import Counter
from typing import Optional

import numpy as np
import openvino as ov

LOGITS_ROWS = "logits_rows"  # an input we add to the paged IR: the token rows whose logits are computed


def int4_group_size(model: ov.Model) -> Optional[int]:
    """The group size of the model's int4 weights (stored as [rows, groups, group size]), or None."""
    shapes = [op.get_output_shape(0) for op in model.get_ops()
              if op.get_type_name() == "Constant" and op.get_element_type() in (ov.Type.u4, ov.Type.i4)]
    sizes = Counter(shape[-1] for shape in shapes if len(shape) == 3 and shape[-1] > 1)  # > 1: not zero points
    return int(sizes.most_common(1)[0][0]) if sizes else None


def compile_for_block(core: ov.Core, model: ov.Model, device: str, config: dict, n: int) -> ov.CompiledModel:
    """The paged model compiled for blocks of exactly n tokens: its token inputs get the static shape [n]."""
    copy = model.clone()
    copy.reshape({name: ov.PartialShape([n]) for name in ("input_ids", "position_ids")})
    return core.compile_model(copy, device, config)


def _output_matmul(model: ov.Model):
    """The node that computes the logits from the last hidden state (a MatMul in the IRs optimum-intel writes)."""
    return model.output("logits").get_node().input_value(0).get_node()


def compute_logits_rows(model: ov.Model) -> None:
    """Let the paged IR compute logits only for the token rows `logits_rows` lists: a Gather before the output
    layer (the paged IR holds every token of a call on axis 0, whatever sequence it belongs to).

    For a prompt of a few dozen tokens and a vocabulary of 150k, the output layer's rows we do not need cost
    about as much as a whole decode step; in a batched call, the rows of every sequence but the last ones of its
    block (a re-fed token, the start of a prompt) are skipped the same way.
    """
    import openvino.opset13 as ops

    matmul = _output_matmul(model)
    if matmul.get_type_name() != "MatMul":  # an IR of another shape (a softcap, a cast): leave it whole
        return
    rows = ops.parameter([-1], ov.Type.i64, name=LOGITS_ROWS)
    rows.output(0).get_tensor().set_names({LOGITS_ROWS})
    gathered = ops.gather(matmul.input_value(0), rows, ops.constant(np.array(0)))
    matmul.input(0).replace_source_output(gathered.output(0))
    model.add_parameters([rows])
    model.validate_nodes_and_infer_types()


def keep_output_rows(model: ov.Model, ids: np.ndarray) -> bool:
    """Cut the output layer down to the rows of the token ids `ids` (sorted, unique); False if it has no such form.

    The output layer of a small draft is a large part of its step: Qwen2.5-0.5B reads 136 MB of int8 lm_head
    weights per token, a quarter of the model. The output layer gets a copy of its weight-decompression chain in
    which every constant with one row per token (int8/int4 values, scales, zero points) holds only the kept rows,
    so the plugin still runs a compressed matmul; the embedding, if it shares the weight, keeps the original.
    The logits output then has len(ids) columns.
    """
    import openvino.opset13 as ops

    matmul = _output_matmul(model)
    vocab = model.output("logits").get_partial_shape()[-1]
    if matmul.get_type_name() != "MatMul" or not vocab.is_static or not matmul.get_attributes().get("transpose_b"):
        return False
    vocab = vocab.get_length()
    rebuild = {"Convert": lambda node, x: ops.convert(x[0], node.get_output_element_type(0)),
               "Subtract": lambda node, x: ops.subtract(x[0], x[1]),
               "Multiply": lambda node, x: ops.multiply(x[0], x[1]),
               "Reshape": lambda node, x: ops.reshape(x[0], x[1], node.get_attributes()["special_zero"])}

    def cut(output: ov.Output, reshape_target: bool = False) -> Optional[ov.Output]:
        node = output.get_node()
        kind = node.get_type_name()
        if kind == "Constant":
            shape = list(output.get_shape())
            if shape and shape[0] == vocab:
                per_row = np.asarray(node.get_data()).view(np.uint8).reshape(vocab, -1)  # packed int4 too
                tensor = ov.Tensor(node.get_output_element_type(0), ov.Shape([len(ids)] + shape[1:]))
                tensor.data.view(np.uint8).reshape(len(ids), -1)[:] = per_row[ids]
                return ov.op.Constant(tensor).output(0)
            if reshape_target and shape and np.asarray(node.get_data())[0] == vocab:
                target = np.asarray(node.get_data()).copy()  # a group-quantized weight folded back to 2-D
                target[0] = len(ids)
                return ops.constant(target).output(0)
            return output  # a scalar or a per-column constant: shared as it is
        inputs = [cut(port.get_source_output(), kind == "Reshape" and port.get_index() == 1)
                  for port in node.inputs()]
        if kind not in rebuild or any(x is None for x in inputs):
            return None  # a chain of another form: keep the layer whole
        return rebuild[kind](node, inputs).output(0)

    weight = cut(matmul.input_value(1))
    if weight is None or weight.get_partial_shape()[0] != len(ids):
        return False
    matmul.input(1).replace_source_output(weight)
    model.validate_nodes_and_infer_types()
    return True
