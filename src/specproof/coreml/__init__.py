"""specproof.coreml: inspect Core ML bundles for verify qualification, export reference targets as them.

- ``inspect_bundle(path, k=K)`` -> ``BundleReport``: the interface of every function of
  an ``.mlpackage`` (read without loading the model, on any OS), its state layout, and a
  verdict per function: can it run a verify forward of K draft tokens?
- ``export_bundle(path, target, k=K, layout=..., gdn=...)`` -> ``ExportResult``: a
  ``ReferenceHybrid`` (conv, attention and Gated DeltaNet blocks; dense or mixture-of-experts
  feed-forwards) as a stateful iOS 18 / macOS 15 ML program, in either state layout
  (``LAYOUTS``); ``FAMILIES`` / ``family_target`` are the flagship shapes (``lfm2-moe``,
  ``qwen3.6-moe``).
- ``export_multifunction(path, target, k=K, layout=..., gdn=...)``: the same program as fixed-shape
  ``decode`` (1 token) and ``verify`` (K + 1 tokens) functions of one package, sharing weights and states.
- ``HostLoop(path, drafter).generate(prompt, n)``: docs/swift-engine.md's host loop over a multifunction bundle,
  run by the evaluator; its ``Generation`` is what ``specproof bundle host-loop`` writes as a trace.
- ``export_tree(path, target, nodes=N, k=K, multifunction=...)``: the chain functions plus ``verify_tree``, a token
  tree of N nodes in one forward (``input_ids [1, N]``, ``parents [N]``; per-node states out for the host).
- ``write_golden(path, target, target_spec=...)``: greedy tokens for ``GOLDEN_PROMPTS``
  in the golden format (``specproof.formats.golden``) that ``specproof check-trace --greedy`` reads.
- ``check_bundle(path, source, options=CheckOptions(...))`` -> ``BundleCheckReport``: the bundle (through
  the evaluator) against the model it was exported from: logits, states and greedy tokens (``CHECK_RULES``).
- ``MilEvaluator`` runs a saved program in numpy on any OS (the ops in ``EVALUATOR_OPS``);
  ``CoreMLEvalTarget`` (``coreml-eval:PATH``) and ``CoreMLTarget`` (``coreml:PATH``,
  macOS 15+ only) live in ``specproof.engine.targets``.

coremltools is imported lazily: importing this module needs only the core install.
"""

from specproof.coreml._check import CHECK_RULES, BundleCheckReport, CheckOptions, CheckResult, check_bundle
from specproof.coreml._export import (
    DEFAULT_EXPORT_TARGET,
    DEFAULT_MAX_QUERY,
    DEFAULT_MAX_QUERY_GDN,
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
from specproof.coreml._families import FAMILIES, family_spec, family_target, load_family_spec
from specproof.coreml._host_loop import HOST_LOOP_STEPS, HostLoop
from specproof.coreml._inspect import (
    BundleReadError,
    BundleReport,
    FunctionReport,
    RuleResult,
    TensorInfo,
    inspect_bundle,
)
from specproof.coreml._multifunction import export_multifunction, function_sizes
from specproof.coreml._options import GDN_FORMS, LAYOUTS, PLANTED_BUGS, POSITIONS, ExportOptions
from specproof.coreml._tree_export import check_tree_nodes, export_tree
from specproof.coreml._tree_inspect import TreeVerdict
from specproof.engine.targets.mil_eval import OPS as EVALUATOR_OPS
from specproof.engine.targets.mil_eval import MilEvaluator, UnknownOpError, load_program

__all__ = [
    "CHECK_RULES",
    "DEFAULT_EXPORT_TARGET",
    "DEFAULT_MAX_QUERY",
    "DEFAULT_MAX_QUERY_GDN",
    "EVALUATOR_OPS",
    "FAMILIES",
    "GDN_FORMS",
    "GOLDEN_FORMAT",
    "GOLDEN_PROMPTS",
    "HOST_LOOP_STEPS",
    "LAYOUTS",
    "PLANTED_BUGS",
    "POSITIONS",
    "BundleCheckReport",
    "BundleReadError",
    "CheckOptions",
    "CheckResult",
    "BundleReport",
    "ExportOptions",
    "ExportResult",
    "FunctionReport",
    "HostLoop",
    "MilEvaluator",
    "RuleResult",
    "TensorInfo",
    "TreeVerdict",
    "UnknownOpError",
    "build_program",
    "check_bundle",
    "check_exportable",
    "check_tree_nodes",
    "export_bundle",
    "export_config",
    "export_multifunction",
    "export_tree",
    "function_sizes",
    "family_spec",
    "family_target",
    "golden_cases",
    "inspect_bundle",
    "load_family_spec",
    "load_program",
    "write_golden",
]
