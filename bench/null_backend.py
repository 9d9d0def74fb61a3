"""The do-nothing model inside Triton's Python backend (`null_model.py --frontend python-backend`).

Imported by the backend stub only (`triton_python_backend_utils` exists there alone): every
request of the model's interface is answered with null_model's zeros, straight from the stub.
"""

from __future__ import annotations

import json

import triton_python_backend_utils as pb_utils

from bench.null_model import BY_MODEL, zeros


class TritonPythonModel:
    """Triton's Python-backend entry points."""

    def initialize(self, args: dict) -> None:
        interface = BY_MODEL[json.loads(args["model_config"])["name"]]
        self.counts = interface.field_to_input["num_candidates"]
        self.answer = zeros(interface)

    def execute(self, requests: list) -> list:
        asked = [{self.counts: pb_utils.get_input_tensor_by_name(r, self.counts).as_numpy()} for r in requests]
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, array) for name, array in out.items()])
                for out in self.answer(asked)]
