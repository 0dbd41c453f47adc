"""Vision: torchvision's image decoding, datasets (and, next, transforms) on libjpeg-turbo and
OpenCV. Importing this package is cheap; the submodules import numpy, OpenCV and Pillow."""
