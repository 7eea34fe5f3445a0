"""`python -m zeptograd.nn.onnx model.onnx`: the model's inputs, outputs, op counts and unsupported ops."""

import sys

from zeptograd.nn.onnx import model_summary


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: python -m zeptograd.nn.onnx model.onnx", file=sys.stderr)
        return 2
    print(model_summary(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
