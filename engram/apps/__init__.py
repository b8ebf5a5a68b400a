"""The applications on top of the runtime: the model presets (presets), the demo, the deployment planner
(planning), the environment doctor, the real-text corpus and the hot-row profile, and the plots."""
