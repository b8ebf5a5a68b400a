// The ECMAScript engine's answer for each pattern (tests/validation/test_ecma_patterns.py): JSON lines
// {pattern, strings} in, {u, annexb, matches} out. A pattern is read with the u flag, else without flags
// (Annex B), as JSON Schema patterns are; matches: RegExp.prototype.test on each string.
const lines = require("readline").createInterface({ input: process.stdin });
lines.on("line", (line) => {
  const { pattern, strings } = JSON.parse(line);
  let re = null;
  let u = false;
  let annexb = false;
  try {
    re = new RegExp(pattern, "u");
    u = true;
  } catch (e) {
    try {
      re = new RegExp(pattern);
      annexb = true;
    } catch (e2) {}
  }
  const matches = re === null ? null : strings.map((s) => re.test(s));
  console.log(JSON.stringify({ u, annexb, matches }));
});
