"""The runtime: loads a bundle and decodes with OpenVINO, openvino-tokenizers and numpy only."""
