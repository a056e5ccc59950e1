"""GeLU from primitives on every available device: see stitchml/demos/gelu.py."""
import sys

from stitchml.demos.gelu import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
