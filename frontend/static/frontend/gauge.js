// A labelled meter: a bar plus the figures in words (never colour alone).

import { el } from "./format.js";


