"""End to end: trainings written the way users write them (patterns_train.py: an EMA copy with
evaluation passes and clipped gradients; a GAN; autocast; tied embeddings, BatchNorm, a frozen
layer, two parameter groups, gradient accumulation and weights replaced; gradient accumulation
through non-reentrant checkpoints; autocast around them; a module of no model called by every
block), under `tidemark run`,
their memory checked block by block against the truth each run computed itself."""
import json
import os

from tidemark_env import PYTHON, DaemonTestCase, block_categories, blocks_of

HERE = os.path.dirname(os.path.abspath(__file__))
FORWARD_PHASE, BACKWARD_PHASE, RECOMPUTE_PHASE, EVAL_PHASE = 1, 2, 3, 5  # tidemark.v1.Phase


class PatternsTest(DaemonTestCase):
    runs = {}

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.runs = {}
        for pattern in ("ema", "gan", "autocast", "autocast_checkpoint", "zoo", "accumulate",
                        "helper", "lbfgs", "autograd_grad", "forward_call",
                        "master_weights"):
            out = os.path.join(cls.daemon.dir, pattern + ".json")
            r = cls.daemon.run(PYTHON, os.path.join(HERE, "patterns_train.py"), "--pattern",
                               pattern, "--steps", "3", "--out", out)
            if r.returncode != 0:
                raise AssertionError("training failed: %s\n%s" % (r.stdout, r.stderr))
            with open(out) as f:
                truth = json.load(f)
            sid = cls.daemon.newest_session()["id"]
            session = cls.daemon.wait_analyzed(sid)
            cls.runs[pattern] = {"truth": truth, "session": session,
                                 "categories": block_categories(cls.daemon, sid)}

    def categories_of(self, pattern, snap):
        run = self.runs[pattern]
        blocks = blocks_of(self.daemon, run["session"]["id"], snap)
        self.assertEqual(len(blocks), len(snap["storages"]), "a storage without its block")
        return {run["categories"][i] for i, _ in blocks}, sum(n for _, n in blocks)

    def tag_names_at(self, sid, address, ts):
        """The name of the last tag on the address by the time ts (a list: empty when none)."""
        return [r[0] for r in self.daemon.sql(
            "SELECT s.value FROM tag t JOIN string s ON s.session_id = t.session_id "
            "AND s.iid = t.name_id WHERE t.session_id = ? AND t.address = ? AND "
            "t.ts_ns <= ? ORDER BY t.seq DESC LIMIT 1", sid, int(address), ts)]

    # ----- an EMA copy, evaluation passes, clipped gradients --------------------------------------
    def test_steps_are_training_iterations_and_evaluations_their_own_phase(self):
        run = self.runs["ema"]
        sid, truth = run["session"]["id"], run["truth"]
        # Three training steps; the evaluation after the last one is no fourth.
        self.assertEqual(run["session"]["steps"], len(truth["steps"]))
        evals = self.daemon.sql("SELECT begin_ts_ns, end_ts_ns FROM phase WHERE session_id = ? "
                                "AND phase = ? ORDER BY begin_ts_ns", sid, EVAL_PHASE)
        self.assertEqual(len(evals), len(truth["evals"]))
        for (begin, end), (t0, t1) in zip(evals, truth["evals"]):
            self.assertTrue(t0 <= begin <= end <= t1, (begin, end, t0, t1))
        steps = self.daemon.cli_json("steps", str(sid))["steps"]
        for s in steps:
            for begin, end in evals:
                self.assertTrue(end < s["begin_ts_ns"] or begin > s["end_ts_ns"],
                                "an evaluation inside step %d" % s["step"])

    def test_the_ema_copy_is_a_named_frozen_weight_from_the_start(self):
        run = self.runs["ema"]
        sid, truth = run["session"]["id"], run["truth"]
        cats, ema_bytes = self.categories_of("ema", truth["ema"])
        self.assertEqual(cats, {"WEIGHT"})
        cats, param_bytes = self.categories_of("ema", truth["params"])
        self.assertEqual(cats, {"WEIGHT"})
        names = dict(self.daemon.sql(
            "SELECT t.address, s.value FROM tag t JOIN string s ON s.session_id = t.session_id "
            "AND s.iid = t.name_id WHERE t.session_id = ? AND t.category = 1", sid))
        for addr in truth["ema"]["storages"]:
            self.assertTrue(names[int(addr)].startswith("TinyGPT [frozen]."), names[int(addr)])
        for addr in truth["params"]["storages"]:
            self.assertTrue(names[int(addr)].startswith("TinyGPT."), names[int(addr)])
        # At every step's peak, before the copy is first evaluated too: both models' weights.
        for step in range(1, len(truth["steps"]) + 1):
            b = self.daemon.cli_json("breakdown", str(sid), "--step", str(step))
            self.assertEqual(b["categories"]["WEIGHT"]["bytes"], param_bytes + ema_bytes)

    def test_gradient_clipping_scratch_is_temporary(self):
        """Scratch of clip_grad_norm_ (on torch 1.13 with the inf norm, a |g| copy of each
        gradient; on torch 2 a norm per gradient) belongs to the optimizer phase."""
        run = self.runs["ema"]
        sid = run["session"]["id"]
        seen = 0
        for st in run["truth"]["steps"]:
            w = st["clip"]
            for i, n in self.daemon.sql(
                    "SELECT id, size_bytes FROM allocation WHERE session_id = ? AND "
                    "alloc_ts_ns > ? AND free_ts_ns < ?", sid, w[0], w[1]):
                seen += 1
                self.assertEqual(run["categories"][i], "TEMPORARY", "%d bytes" % n)
        self.assertGreater(seen, 0, "clipping allocated nothing")

    def test_nothing_born_and_dead_in_backward_is_unknown(self):
        """The gradient a (reentrant) checkpointed block hands back for its input is born in the
        backward it runs itself, and dies in the outer one. (What torch makes once, at the first
        backward, for the rest of the process is not asked about.)"""
        run = self.runs["ema"]
        sid = run["session"]["id"]
        for st in run["truth"]["steps"]:
            w = st["backward"]
            blocks = self.daemon.sql(
                "SELECT id, size_bytes FROM allocation WHERE session_id = ? AND alloc_ts_ns > ? "
                "AND free_ts_ns < ? AND size_bytes >= 1024", sid, w[0], w[1])
            # The gradient of the checkpointed block's input (4 x 64 x 64 floats) among them.
            self.assertIn(4 * 64 * 64 * 4, [n for _, n in blocks])
            unknown = [n for i, n in blocks if run["categories"][i] == "UNKNOWN"]
            self.assertEqual(unknown, [])

    # ----- a GAN --------------------------------------------------------------------------------
    def test_gan_iteration_is_one_step(self):
        run = self.runs["gan"]
        self.assertEqual(run["session"]["steps"], len(run["truth"]["steps"]))

    def test_generator_output_is_an_activation_and_targets_are_inputs(self):
        for step, st in enumerate(self.runs["gan"]["truth"]["steps"], start=1):
            with self.subTest(step=step):
                self.assertEqual(self.categories_of("gan", st["fake"])[0], {"ACTIVATION"})
                self.assertEqual(self.categories_of("gan", st["real"])[0], {"INPUT"})
                self.assertEqual(self.categories_of("gan", st["targets"])[0], {"INPUT"})

    # ----- tied embeddings, BatchNorm, a frozen layer, parameter groups, accumulation --------
    def test_model_state_is_exact_at_every_step_end(self):
        run = self.runs["zoo"]
        sid, truth = run["session"]["id"], run["truth"]
        # Two micro-batches an optimizer step: one step.
        self.assertEqual(run["session"]["steps"], len(truth["steps"]))
        # The tied weight once. One weight's storage is replaced before the second step, and a
        # buffer and a frozen parameter by new tensors before the third (same sizes): the new
        # blocks are WEIGHT from then on, so WEIGHT stays the same at every step end.
        weights = sum(truth["weights"]["storages"].values())
        steps = self.daemon.cli_json("steps", str(sid))["steps"]
        for s, st in zip(steps, truth["steps"]):
            with self.subTest(step=s["step"]):
                self.assertTrue(all(st["frozen_grads"]))
                b = self.daemon.cli_json("breakdown", str(sid), "--at", str(s["end_ts_ns"]))
                cats = {k: v["bytes"] for k, v in b["categories"].items()}
                self.assertEqual(cats["WEIGHT"], weights)  # parameters and BatchNorm's buffers
                self.assertEqual(cats["GRADIENT"], sum(st["grads"]["storages"].values()))
                self.assertEqual(cats["OPTIMIZER_STATE"],
                                 sum(st["optimizer"]["storages"].values()))
                self.assertEqual(self.categories_of("zoo", st["grads"])[0], {"GRADIENT"})

    def test_a_step_given_a_closure_ends_with_its_gradients_and_listed_state(self):
        # LBFGS: the forward and backward inside its step; its history in lists of tensors
        # (UNKNOWN before: 70 MiB of 117 after four steps of a larger model), growing a step at
        # a time; the last closure's gradients, made after the step's pre-hook (UNKNOWN at the
        # last step before).
        run = self.runs["lbfgs"]
        sid, truth = run["session"]["id"], run["truth"]
        self.assertEqual(run["session"]["steps"], len(truth["steps"]))
        steps = self.daemon.cli_json("steps", str(sid))["steps"]
        held = []
        for s, st in zip(steps, truth["steps"]):
            with self.subTest(step=s["step"]):
                b = self.daemon.cli_json("breakdown", str(sid), "--at", str(s["end_ts_ns"]))
                cats = {k: v["bytes"] for k, v in b["categories"].items()}
                held.append(cats["OPTIMIZER_STATE"])
                self.assertEqual(cats["GRADIENT"], sum(st["grads"]["storages"].values()))
                self.assertEqual(cats["OPTIMIZER_STATE"],
                                 sum(st["optimizer"]["storages"].values()))
                self.assertEqual(self.categories_of("lbfgs", st["optimizer"])[0],
                                 {"OPTIMIZER_STATE"})
        self.assertLess(held[0], held[-1], "the history grows")

    def test_gradients_taken_by_autograd_grad_are_a_backward(self):
        # torch.autograd.grad instead of backward(): its working memory was UNKNOWN, outside any
        # phase (11 of 41 MiB at the step's peak of a larger model); now a backward phase's.
        run = self.runs["autograd_grad"]
        sid, truth = run["session"]["id"], run["truth"]
        self.assertEqual(run["session"]["steps"], len(truth["steps"]))
        backwards = self.daemon.sql("SELECT COUNT(*) FROM phase WHERE session_id = ? AND "
                                    "phase = ?", sid, BACKWARD_PHASE)[0][0]
        self.assertEqual(backwards, len(truth["steps"]))
        for s, st in zip(self.daemon.cli_json("steps", str(sid))["steps"], truth["steps"]):
            with self.subTest(step=s["step"]):
                peak = self.daemon.cli_json("breakdown", str(sid), "--step", str(s["step"]))
                cats = {k: v["bytes"] for k, v in peak["categories"].items()}
                self.assertLess(cats.get("UNKNOWN", 0), 4096, cats)
                b = self.daemon.cli_json("breakdown", str(sid), "--at", str(s["end_ts_ns"]))
                self.assertEqual({k: v["bytes"] for k, v in b["categories"].items()}["GRADIENT"],
                                 sum(st["grads"]["storages"].values()))

    def test_a_backward_outside_any_step_begins_one(self):
        # A loop calling model.forward(x) itself skips the model's hooks: no forward began the
        # step, and it began at the optimizer's step (its backward, often the step's peak, fell
        # between steps). The backward now begins it.
        run = self.runs["forward_call"]
        sid, truth = run["session"]["id"], run["truth"]
        steps = self.daemon.cli_json("steps", str(sid))["steps"]
        self.assertEqual(len(steps), len(truth["steps"]))
        backwards = self.daemon.sql("SELECT begin_ts_ns, end_ts_ns FROM phase WHERE session_id = ? "
                                    "AND phase = ? ORDER BY begin_ts_ns", sid, BACKWARD_PHASE)
        self.assertEqual(len(backwards), len(truth["steps"]))
        for s, (begin, end), st in zip(steps, backwards, truth["steps"]):
            with self.subTest(step=s["step"]):
                t0, t1 = st["backward"]
                self.assertTrue(t0 <= begin <= end <= t1, (begin, end, st["backward"]))
                self.assertTrue(s["begin_ts_ns"] <= begin and end <= s["end_ts_ns"],
                                (s, begin, end))
                b = self.daemon.cli_json("breakdown", str(sid), "--at", str(s["end_ts_ns"]))
                self.assertEqual(b["categories"]["GRADIENT"]["bytes"],
                                 sum(st["grads"]["storages"].values()))
                # Its parameters, in no model the adapter saw called: WEIGHT as the optimizer's.
                self.assertEqual(b["categories"]["WEIGHT"]["bytes"],
                                 sum(st["weights"]["storages"].values()))
                # What its backward freed, saved by a forward no hook saw (the saved-tensor
                # hooks not entered): ACTIVATION by its lifetime (the 1 MiB ReLU output), not
                # UNKNOWN (1.34 of 4.41 MiB at the peaks of steps 2 and 3 before). What stays
                # UNKNOWN is what the model's hooks would name and this loop bypasses: the batch
                # (x, y) and the model's output, alive past the backward.
                peak = self.daemon.cli_json("breakdown", str(sid), "--step", str(s["step"]))
                cats = {k: v["bytes"] for k, v in peak["categories"].items()}
                self.assertGreaterEqual(cats.get("ACTIVATION", 0), 256 * 1024 * 4, cats)
                self.assertLessEqual(cats.get("UNKNOWN", 0), (256 * 256 + 2 * 256 * 16) * 4, cats)

    def test_master_weights_the_optimizer_holds_are_weights(self):
        # fp32 copies of a bfloat16 model's weights, held by its optimizer and by no model: they
        # were UNKNOWN (8 of 45 MiB at the peak of a larger model).
        run = self.runs["master_weights"]
        sid, truth = run["session"]["id"], run["truth"]
        for s, st in zip(self.daemon.cli_json("steps", str(sid))["steps"], truth["steps"]):
            with self.subTest(step=s["step"]):
                b = self.daemon.cli_json("breakdown", str(sid), "--at", str(s["end_ts_ns"]))
                cats = {k: v["bytes"] for k, v in b["categories"].items()}
                self.assertEqual(cats["WEIGHT"], sum(st["weights"]["storages"].values()))
                self.assertEqual(self.categories_of("master_weights", st["weights"])[0],
                                 {"WEIGHT"})
                self.assertLess(cats.get("UNKNOWN", 0), 4096, cats)

    # ----- accumulation through non-reentrant checkpoints ---------------------------------------
    def test_every_micro_batch_forward_is_a_forward_after_early_stopped_recomputations(self):
        """torch 2's non-reentrant checkpoint stops a recomputation inside its block once the
        backward has what it needs; the modules it stopped in must not stay open, or the next
        micro-batch's forward is taken for a module call inside one (no forward phase: its
        memory was UNKNOWN)."""
        run = self.runs["accumulate"]
        sid, truth = run["session"]["id"], run["truth"]
        self.assertEqual(run["session"]["steps"], len(truth["steps"]))
        windows = [w for st in truth["steps"] for w in st["forwards"]]
        forwards = self.daemon.sql("SELECT begin_ts_ns, end_ts_ns FROM phase WHERE session_id = ? "
                                   "AND phase = ? ORDER BY begin_ts_ns", sid, FORWARD_PHASE)
        self.assertEqual(len(forwards), len(windows))
        for (begin, end), (t0, t1) in zip(forwards, windows):
            self.assertTrue(t0 <= begin <= end <= t1, (begin, end, t0, t1))
        # Every module scope opened in a recomputation ends in it (there are some).
        inside = ("FROM scope s JOIN phase p ON p.session_id = s.session_id AND p.phase = ? AND "
                  "s.begin_seq > p.begin_seq AND s.begin_seq < p.end_seq "
                  "WHERE s.session_id = ? AND s.kind = 0")
        opened = self.daemon.sql("SELECT COUNT(*) " + inside, RECOMPUTE_PHASE, sid)[0][0]
        self.assertGreater(opened, 0)
        left_open = self.daemon.sql("SELECT COUNT(*) " + inside + " AND (s.end_seq IS NULL OR "
                                    "s.end_seq > p.end_seq)", RECOMPUTE_PHASE, sid)[0][0]
        self.assertEqual(left_open, 0)
        # What every forward makes has a category: none of its blocks is UNKNOWN.
        for t0, t1 in windows:
            blocks = self.daemon.sql(
                "SELECT id, size_bytes FROM allocation WHERE session_id = ? AND alloc_ts_ns > ? "
                "AND alloc_ts_ns < ? AND size_bytes >= 1024", sid, t0, t1)
            self.assertTrue(blocks)
            unknown = [n for i, n in blocks if run["categories"][i] == "UNKNOWN"]
            self.assertEqual(unknown, [], (t0, t1))

    # ----- a module of no model ---------------------------------------------------------------
    def test_a_module_of_no_model_is_named_after_the_module_calling_it(self):
        """A module shared by every block and held by none (as `transformers` makes modules of
        functions): its scope, and what it saves for backward, belong to the block that called
        it, not to one `Swish` of the whole model."""
        sid = self.runs["helper"]["session"]["id"]
        scopes = {n: c for n, c in self.daemon.sql(
            "SELECT st.value, COUNT(*) FROM scope s JOIN string st ON st.session_id = s.session_id "
            "AND st.iid = s.name_id WHERE s.session_id = ? AND st.value LIKE '%Swish%' "
            "GROUP BY st.value", sid)}
        steps = self.runs["helper"]["session"]["steps"]
        # Its forward in each block, and its backward (what it saved, unpacked) in each block's.
        self.assertEqual(scopes, {"Sequential.%d.Swish%s" % (i, kind): steps
                                  for i in (0, 1) for kind in ("", " [backward]")})
        saved = {n for (n,) in self.daemon.sql(
            "SELECT DISTINCT st.value FROM tag t JOIN string st ON st.session_id = t.session_id "
            "AND st.iid = t.name_id WHERE t.session_id = ? AND t.category = 4", sid)}
        self.assertTrue({"Sequential.0.Swish:saved", "Sequential.1.Swish:saved"} <= saved, saved)
        self.assertFalse([n for n in saved if n.startswith("Swish")], saved)

    def test_the_output_the_loop_holds_is_the_models_named_activation(self):
        """The loop holds the model's output through the backward, which does not save it (as
        `out = model(...)`, then `out.loss.backward()`): the forward's last activation, named
        after the model (was UNKNOWN)."""
        run = self.runs["helper"]
        sid = run["session"]["id"]
        for step, st in enumerate(run["truth"]["steps"], start=1):
            with self.subTest(step=step):
                self.assertEqual(self.categories_of("helper", st["output"])[0], {"ACTIVATION"})
                for addr in st["output"]["storages"]:
                    names = self.tag_names_at(sid, addr, st["output"]["ts"])
                    self.assertEqual(names, ["Sequential:output"])

    # ----- autocast ---------------------------------------------------------------------------
    def check_casts(self, pattern, category, suffix, least):
        """Every step's weight casts (at least `least` of them) are `category`, each named after
        its weight with `suffix`."""
        run = self.runs[pattern]
        sid = run["session"]["id"]
        for step, st in enumerate(run["truth"]["steps"], start=1):
            casts = st["casts"]
            self.assertGreaterEqual(len(casts["storages"]), least)
            with self.subTest(pattern=pattern, step=step):
                self.assertEqual(self.categories_of(pattern, casts)[0], {category})
                for addr, param in casts["names"].items():
                    self.assertEqual(self.tag_names_at(sid, addr, casts["ts"]),
                                     ["TinyGPT.%s %s" % (param, suffix)])

    def test_autocast_weight_copies_are_named_after_their_weights(self):
        """The bfloat16 copies of the weights autocast keeps for backward are activations (made
        again when their block is recomputed), named after the weight they copy."""
        self.check_casts("autocast", "ACTIVATION", "(bfloat16 cast)", 4)  # every Linear's

    def test_autocast_cache_inside_checkpoints_is_named_after_its_weights(self):
        """Inside non-reentrant checkpoints nothing saves the weights' bfloat16 copies; autocast's
        cache holds them until its region exits: TEMPORARY, named after the weight (were
        UNKNOWN)."""
        # The blocks' 8 Linear weights (probed: the truth has no more).
        self.check_casts("autocast_checkpoint", "TEMPORARY", "(bfloat16 cast, autocast cache)", 8)

    def test_native_library_memory_is_workspace_named_after_its_library(self):
        """oneDNN's primitive caches and scratchpads (bfloat16 matmuls make them outside torch's
        tensor allocator in libc10; some while the library loads) are
        WORKSPACE named after the library, not UNKNOWN, and none of the run's tensors is."""
        run = self.runs["autocast"]
        sid, truth = run["session"]["id"], run["truth"]
        tags = self.daemon.sql(
            "SELECT DISTINCT s.value FROM tag t JOIN string s ON s.session_id = t.session_id "
            "AND s.iid = t.name_id WHERE t.session_id = ? AND t.category = 9", sid)
        names = sorted(n for (n,) in tags)
        self.assertTrue(names, "no native library's memory tagged")
        self.assertTrue(all(n.startswith("[native] ") for n in names), names)
        # oneDNN: inside libtorch_cpu (PyPI's torch), or Debian's own libdnnl.
        self.assertTrue(any(n.startswith(("[native] libtorch_cpu.so", "[native] libdnnl.so"))
                            for n in names), names)
        # The run's tensors are the framework's, whatever a native library allocated beside them.
        cats, _ = self.categories_of("autocast", truth["params"])
        self.assertEqual(cats, {"WEIGHT"})
        for step, st in enumerate(truth["steps"], start=1):
            with self.subTest(step=step):
                self.assertNotIn("WORKSPACE", self.categories_of("autocast", st["casts"])[0])
                b = self.daemon.cli_json("breakdown", str(sid), "--step", str(step))
                cats = {k: v["bytes"] for k, v in b["categories"].items()}
                self.assertGreater(cats["WORKSPACE"], 0)
                # What is left unknown at the peak is a few bytes (torch's untagged scalars),
                # not the megabytes of oneDNN's caches.
                self.assertLess(cats["UNKNOWN"], 1024, cats)


if __name__ == "__main__":
    import unittest
    unittest.main()
