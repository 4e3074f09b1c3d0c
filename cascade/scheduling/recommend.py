"""Which framework to train with: a decision tree over the task, where the model is deployed, the team and
the priority, each step with its reason, ending in the images that run it on the hardware at hand.

The tree walks four questions in order; each answer keeps or orders the frameworks and says why
(a deployment target narrows what can be exported; a task keeps the ecosystems with its
libraries; a team's habits favour eager Python or static graphs, and the three preferences are
added up; a priority of scale puts the distributed stack on top). The first framework left is the recommendation, the rest are
alternatives; ``images`` gives each one's image for every vendor the inventory has, or says that
no image of it runs there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cascade.scheduling import frameworks

TASKS = ("vision", "nlp", "recsys", "rl")
DEPLOYS = ("cloud", "mobile", "edge")
TEAMS = ("python", "engineering")
PRIORITIES = ("iteration", "scale")

DEPLOY: dict[str, tuple[tuple[str, ...], str]] = {
    "cloud": (("pytorch", "tensorflow", "paddle", "jax", "xgboost", "ray"),
              "in the cloud every framework's model can be served (Cascade serves TorchScript, ONNX, "
              "TensorFlow SavedModel, XGBoost and scikit-learn)"),
    "mobile": (("tensorflow", "pytorch", "paddle"),
               "on phones the model must export to a mobile runtime: TensorFlow Lite, ExecuTorch/TorchScript Lite, "
               "Paddle Lite"),
    "edge": (("pytorch", "paddle", "tensorflow"),
             "edge boxes run ONNX or TorchScript (Cascade's edge agents serve both), Paddle Lite on Ascend and "
             "Kunlun boards, or TensorFlow Lite"),
}
TASK: dict[str, tuple[tuple[str, ...], str]] = {
    "vision": (("pytorch", "paddle", "tensorflow"),
               "vision models and pretrained weights live mostly in torchvision/timm/Detectron2, then PaddleDetection "
               "and PaddleOCR, then Keras"),
    "nlp": (("pytorch", "jax", "paddle", "tensorflow"),
            "language models come from the Hugging Face ecosystem, PyTorch first, JAX/Flax second"),
    "recsys": (("tensorflow", "paddle", "pytorch", "xgboost"),
               "recommenders need huge sparse embeddings: TensorFlow's parameter servers and PaddleRec are built for "
               "them, TorchRec follows; XGBoost for the feature-based rankers"),
    "rl": (("ray", "pytorch", "jax"),
           "reinforcement learning needs many environment workers beside the learner: Ray (RLlib) runs both, "
           "with PyTorch or JAX policies"),
}
TEAM: dict[str, tuple[tuple[str, ...], str]] = {
    "python": (("pytorch", "jax", "ray", "xgboost"),
               "a research-minded Python team moves fastest with eager execution and plain Python debugging"),
    "engineering": (("tensorflow", "paddle", "pytorch"),
                    "an engineering team gains from static graphs, a fixed export format and a serving stack "
                    "that is part of the framework"),
}
SCALE: dict[str, tuple[str, str]] = {  # task -> (what scales it, why)
    "vision": ("horovod", "data-parallel vision training scales over nodes with Horovod (or PyTorch DDP)"),
    "nlp": ("deepspeed", "models beyond one card's memory need ZeRO sharding: DeepSpeed (or ColossalAI)"),
    "recsys": ("tensorflow", "sparse embeddings scale out on parameter servers"),
    "rl": ("ray", "rollouts scale out as Ray actors"),
}


@dataclass(frozen=True)
class Step:
    question: str
    answer: str
    kept: tuple[str, ...]
    reason: str


@dataclass
class Recommendation:
    steps: list[Step] = field(default_factory=list)
    frameworks: list[str] = field(default_factory=list)  # the first is the recommendation
    scale_with: str = ""  # the distributed layer on top, when the priority is scale


def recommend(task: str, deploy: str, team: str, priority: str) -> Recommendation:
    """Walk the tree; ValueError names a bad answer and the allowed ones."""
    for name, value, allowed in (("task", task, TASKS), ("deploy", deploy, DEPLOYS), ("team", team, TEAMS),
                                 ("priority", priority, PRIORITIES)):
        if value not in allowed:
            raise ValueError(f"--{name} must be one of {', '.join(allowed)}, not {value!r}")
    result = Recommendation()
    left = list(DEPLOY[deploy][0])
    result.steps.append(Step("where is the model deployed?", deploy, tuple(left), DEPLOY[deploy][1]))
    preferred, why = TASK[task]
    ranked = [f for f in preferred if f in left] or left
    result.steps.append(Step("what does the model do?", task, tuple(ranked), why))
    liked, why = TEAM[team]
    deployable, fitting = DEPLOY[deploy][0], ranked

    def score(f: str) -> tuple[int, int]:  # each question's preference counts alike; the task breaks ties
        return (deployable.index(f) + fitting.index(f) + (liked.index(f) if f in liked else len(liked)),
                fitting.index(f))
    ranked = sorted(fitting, key=score)
    result.steps.append(Step("who builds it?", team, tuple(ranked), why))
    if priority == "scale":
        tool, why = SCALE[task]
        if tool in ranked:  # the scaling framework is itself a choice: it goes first
            ranked = [tool, *[f for f in ranked if f != tool]]
        else:  # a layer on top of the first choice
            result.scale_with = tool
        result.steps.append(Step("what matters most?", priority, tuple(ranked), why))
    else:
        result.steps.append(Step("what matters most?", priority, tuple(ranked),
                                 "fast iteration: one framework, one process, no distributed layer until it is needed"))
    result.frameworks = ranked
    return result


def images(names: list[str], vendors: list[str]) -> dict[str, dict[str, str]]:
    """Each framework's image per vendor of the inventory ('' where no image of it runs on that vendor)."""
    return {f: {v: frameworks.image(f, v) if frameworks.supports(f, v) else "" for v in vendors} for f in names}
