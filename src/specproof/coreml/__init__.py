"""specproof.coreml: inspect Core ML bundles for verify qualification, export the reference target as one.

- ``inspect_bundle(path, k=K)`` -> ``BundleReport``: the interface of every function of
  an ``.mlpackage`` (read without loading the model, on any OS) and a verdict per
  function: can it run a verify forward of K draft tokens?
- ``export_bundle(path, target, k=K, ...)`` -> ``ExportResult``: a ``ReferenceHybrid``
  (conv + attn blocks, dense feed-forward) as a stateful iOS 18 / macOS 15 ML program.
- ``write_golden(path, target, target_spec=...)``: greedy tokens for ``GOLDEN_PROMPTS``
  in the golden format (``specproof.formats.golden``) that ``specproof check-trace --greedy`` reads.
- ``CoreMLTarget`` lives in ``specproof.engine.targets.coreml`` (macOS 15+ only).

coremltools is imported lazily: importing this module needs only the core install.
"""

from specproof.coreml._export import (
    DEFAULT_EXPORT_TARGET,
    DEFAULT_MAX_QUERY,
    GOLDEN_FORMAT,
    GOLDEN_PROMPTS,
    ExportResult,
    build_program,
    check_exportable,
    export_bundle,
    export_config,
    golden_cases,
    write_golden,
)
from specproof.coreml._inspect import (
    BundleReadError,
    BundleReport,
    FunctionReport,
    RuleResult,
    TensorInfo,
    inspect_bundle,
)

__all__ = [
    "DEFAULT_EXPORT_TARGET",
    "DEFAULT_MAX_QUERY",
    "GOLDEN_FORMAT",
    "GOLDEN_PROMPTS",
    "BundleReadError",
    "BundleReport",
    "ExportResult",
    "FunctionReport",
    "RuleResult",
    "TensorInfo",
    "build_program",
    "check_exportable",
    "export_bundle",
    "export_config",
    "golden_cases",
    "inspect_bundle",
    "write_golden",
]
