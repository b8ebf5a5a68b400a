"""What the generated validators, structs and flags call: JSON pointers and value descriptions
(json_values), environment booleans (env), `format` checks (formats), ECMA-262 patterns (patterns) and
the argparse action of --engram-config (arguments). Below engram._generated, never above it."""
