# SPDX-License-Identifier: Apache-2.0
"""Type aliases the package's modules share."""

import os
from typing import Union

PathLike = Union[str, "os.PathLike[str]"]
