--[[
jobns_directives.lua: jobns's #JOBNS directive checker, in plain Lua 5.1, for slurmctld
(burst_buffer.lua's slurm_bb_job_process, job_submit.lua), so that sbatch refuses a job
whose directives are wrong, with jobns's own one-line message naming the line or item.

    local d = dofile("/usr/share/jobns/slurm/lua/jobns_directives.lua")
    local problem = d.check(script_text, "JOBNS")  -- nil, or the message
    problem = problem or d.check_comment(job_comment, "JOBNS")  -- sbatch --comment

The word is the nodes' [directives] word; a bad one is a Lua error (the site's mistake),
never a refusal. check() and check_comment() touch no global, file or process.

It is a SUBSET of jobns/launcher/model/directives.py, because slurmctld runs it holding its
locks: it must not fork (so no `jobns check`), block or load a C module. check() is
parse_script; check_comment() is what the prolog does with the job comment
(lifecycle.gather_directives: comment_directives, then parse_directives(...,
source="--comment")). They port every rule that needs only the text: for a script the
header, the directive word and its near misses; for a comment 'jobns:' and its near misses
(_refuse_near_misses: the word jobns at the start, 'jobns' + ':' spelt otherwise, a pasted
#JOBNS line), the items apart by ';', newlines or a later 'jobns:', an item's '\r' and
leading '#'; then for both tokens and trailing comments, verbs, keys and key=value forms,
capacities, shared_tmpdir, stage_in/stage_out paths (their shape, with the parser's own
stand-in symbol values). Each refusal is byte-identical to Python's str(DirectiveError),
repr() included. It accepts what it cannot judge, as the prolog checks everything again:
what needs the node's config ([capacity] granularity: a capacity rounded past the maximum,
"given twice with different values", which compares rounded sizes), the roots, caps, real
symbol values, and --directives (not in a job); a script line that does not end within the
script's first 64 KiB, and a comment longer than 64 KiB (MAX_JUDGED: a hostile 4 MiB script
or comment must not hold slurmctld).

tests/unit/test_lua_directives.py holds it to the Python parser (corpora and property
tests): change both together.

The script is read as jobns reads a script file (open(..., encoding="utf-8",
errors="replace")): undecodable bytes become U+FFFD and \r\n, \r and \n all end a line, so
parse_script's "DOS line break" rule never fires for a script (sbatch refuses \r\n itself).
The comment is read as the prolog reads it from its environment (SLURM_JOB_COMMENT: UTF-8
with surrogateescape): each undecodable byte becomes a lone surrogate, '\udcNN' in repr().
Text is kept as UTF-8 strings; "character" below means a code point, as in Python.
Portable to Lua 5.2-5.4 too: no setfenv, unpack, %z, locale-dependent classes (%a %s %u).
--]]

local M = {}

local DEFAULT_WORD = "JOBNS"
local STOP = "\\\\" -- two backslashes: stop symbol substitution for the rest of the line
-- 2**63-1 as decimal text: Lua 5.1 numbers are doubles, which cannot hold it exactly.
local MAX_BYTES = "9223372036854775807"
local MAX_NUMBER_CHARS = 40
local NAME_MAX, PATH_MAX = 255, 4095
-- Only lines that end within the script's first MAX_JUDGED bytes are judged, and only a job
-- comment of at most MAX_JUDGED bytes: slurmctld must not spend long on a hostile script
-- (Slurm takes up to 4 MiB by default) or comment; past it the prolog judges. A real
-- header is a few KiB, a real comment a line.
local MAX_JUDGED = 64 * 1024

local VERBS = { "shm", "tmp", "shared_tmpdir", "no_rm_tmpdir", "stage_in", "stage_out" }
local KEYS = {
	shm = { "capacity" },
	tmp = { "capacity" },
	shared_tmpdir = {},
	no_rm_tmpdir = {},
	stage_in = { "source", "destination" },
	stage_out = { "source", "destination" },
}
local USAGE = {
	shm = "shm capacity=SIZE",
	tmp = "tmp capacity=SIZE",
	shared_tmpdir = "shared_tmpdir[=yes|per-node|no]",
	no_rm_tmpdir = "no_rm_tmpdir",
	stage_in = "stage_in source=PATH destination=PATH",
	stage_out = "stage_out source=PATH destination=PATH",
}
-- Words that take '=VALUE': a space around their '=' is refused with the joined spelling.
local VALUED = { shared_tmpdir = true, capacity = true, source = true, destination = true }
local LAYOUT = { yes = "shared", ["per-node"] = "per-node", no = "local" }
-- Size suffixes as base^power (decimal text arithmetic below), exactly Slurm's spellings.
local UNITS = {
	K = { 1024, 1 }, KiB = { 1024, 1 }, M = { 1024, 2 }, MiB = { 1024, 2 },
	G = { 1024, 3 }, GiB = { 1024, 3 }, T = { 1024, 4 }, TiB = { 1024, 4 },
	P = { 1024, 5 }, PiB = { 1024, 5 },
	KB = { 1000, 1 }, MB = { 1000, 2 }, GB = { 1000, 3 }, TB = { 1000, 4 }, PB = { 1000, 5 },
}
local NODE_SUFFIX = "N"
-- The stand-ins parse_script substitutes to check a stage path's shape (_PLACEHOLDERS).
local PLACEHOLDERS = { j = "1", A = "1", a = "1", u = "user", x = "job", d = "/workdir" }

local IS_VERB = {}
for _, verb in ipairs(VERBS) do
	IS_VERB[verb] = true
end

local function contains(list, value)
	for _, item in ipairs(list) do
		if item == value then
			return true
		end
	end
	return false
end

-- ------------------------------------------------------------------ text, as Python sees it

local REPLACEMENT = "\239\191\189" -- U+FFFD

-- Well-formed UTF-8 (Unicode table 3-7), for a fast test that a string needs no repair.
local WELL_FORMED = {
	"[\194-\223][\128-\191]",
	"\224[\160-\191][\128-\191]",
	"[\225-\236\238\239][\128-\191][\128-\191]",
	"\237[\128-\159][\128-\191]",
	"\240[\144-\191][\128-\191][\128-\191]",
	"[\241-\243][\128-\191][\128-\191][\128-\191]",
	"\244[\128-\143][\128-\191][\128-\191]",
}

-- The character Python's errors="surrogateescape" makes of an undecodable byte b (0x80 to
-- 0xFF): the lone surrogate U+DC00+b, kept here in UTF-8's form (ED B2/B3 xx), which no
-- well-formed text holds; repr() shows it as '\udcNN' and a path counts it as one byte.
local function escaped_byte(b)
	return "\237" .. (b < 0xC0 and "\178" or "\179") .. string.char(0x80 + b % 0x40)
end

-- A run of bytes >= 0x80 decoded as Python does with errors="replace": one U+FFFD for each
-- maximal ill-formed part (a byte that cannot start a sequence, or a truncated sequence);
-- with errors="surrogateescape" (escape true), one lone surrogate for each of its bytes.
local function repair_run(run, escape)
	local out, i, n = {}, 1, #run
	while i <= n do
		local b = run:byte(i)
		local need, lo, hi = 0, 0x80, 0xBF -- continuation bytes; lo/hi bound the first one
		if b >= 0xC2 and b <= 0xDF then
			need = 1
		elseif b == 0xE0 then
			need, lo = 2, 0xA0
		elseif b == 0xED then
			need, hi = 2, 0x9F -- no UTF-16 surrogates
		elseif b >= 0xE1 and b <= 0xEF then
			need = 2
		elseif b == 0xF0 then
			need, lo = 3, 0x90
		elseif b == 0xF4 then
			need, hi = 3, 0x8F -- nothing above U+10FFFF
		elseif b >= 0xF1 and b <= 0xF3 then
			need = 3
		end
		local good = 0
		local c = run:byte(i + 1)
		if need > 0 and c and c >= lo and c <= hi then
			good = 1
			while good < need do
				c = run:byte(i + 1 + good)
				if not c or c < 0x80 or c > 0xBF then
					break
				end
				good = good + 1
			end
		end
		if need > 0 and good == need then
			out[#out + 1] = run:sub(i, i + need)
		elseif escape then
			for k = i, i + good do
				out[#out + 1] = escaped_byte(run:byte(k))
			end
		else
			out[#out + 1] = REPLACEMENT
		end
		i = i + 1 + good
	end
	return table.concat(out)
end

-- bytes.decode("utf-8", "replace"), as UTF-8 again: the text Python's parser sees in a
-- script. With escape true, bytes.decode("utf-8", "surrogateescape") (os.fsdecode): how
-- Python reads the job comment from the prolog's environment (SLURM_JOB_COMMENT).
function M.decode(bytes, escape)
	if not bytes:find("[\128-\255]") then
		return bytes
	end
	local rest = bytes
	for _, pattern in ipairs(WELL_FORMED) do
		rest = rest:gsub(pattern, "a") -- ASCII, so that no new sequence forms
	end
	if not rest:find("[\128-\255]") then
		return bytes
	end
	if escape then
		return (bytes:gsub("[\128-\255]+", function(run)
			return repair_run(run, true)
		end))
	end
	return (bytes:gsub("[\128-\255]+", repair_run))
end

-- The character (code point, as UTF-8) that starts at byte i of decoded text.
local function char_at(text, i)
	local b = text:byte(i)
	local n = b < 0x80 and 0 or b < 0xE0 and 1 or b < 0xF0 and 2 or 3
	return text:sub(i, i + n)
end

local function codepoint(char)
	local b1, b2, b3, b4 = char:byte(1, 4)
	if #char == 1 then
		return b1
	elseif #char == 2 then
		return (b1 - 0xC0) * 0x40 + (b2 - 0x80)
	elseif #char == 3 then
		return ((b1 - 0xE0) * 0x40 + (b2 - 0x80)) * 0x40 + (b3 - 0x80)
	end
	return (((b1 - 0xF0) * 0x40 + (b2 - 0x80)) * 0x40 + (b3 - 0x80)) * 0x40 + (b4 - 0x80)
end

local function length(text) -- len() in characters: every byte but continuation bytes
	local _, continuations = text:gsub("[\128-\191]", "")
	return #text - continuations
end

local function first_chars(text, n) -- text[:n]
	local i, count = 1, 0
	while count < n and i <= #text do
		i = i + #char_at(text, i)
		count = count + 1
	end
	return text:sub(1, i - 1)
end

-- str.isspace() / str.split(): ASCII \t \n \v \f \r \x1c-\x1f space, and Unicode's.
local ASCII_SPACE = "[\t\n\v\f\r\28-\31 ]"
local SPACE = {}
for _, c in ipairs({ "\t", "\n", "\v", "\f", "\r", "\28", "\29", "\30", "\31", " ",
	"\194\133", "\194\160", "\225\154\128", "\226\128\168", "\226\128\169", "\226\128\175",
	"\226\129\159", "\227\128\128" }) do
	SPACE[c] = true
end
for b = 0x80, 0x8A do -- U+2000..U+200A
	SPACE["\226\128" .. string.char(b)] = true
end

-- text with every whitespace character replaced by one ' ': where only the words matter.
-- Decoded text is well-formed, so a lead byte below starts a character.
local UNICODE_SPACES = {
	"\194[\133\160]", "\225\154\128", "\226\128[\128-\138\168\169\175]", "\226\129\159",
	"\227\128\128",
}
local function blanked(text)
	text = text:gsub(ASCII_SPACE, " ")
	if text:find("[\194\225\226\227]") then
		for _, pattern in ipairs(UNICODE_SPACES) do
			text = text:gsub(pattern, " ")
		end
	end
	return text
end

local function lstrip(text)
	local i = 1
	while true do
		i = text:find("[^\t\n\v\f\r\28-\31 ]", i)
		if not i then
			return ""
		end
		local c = char_at(text, i)
		if not SPACE[c] then
			return text:sub(i)
		end
		i = i + #c
	end
end

-- The start of the character that ends at byte i (decoded text: at most 3 bytes back).
local function char_start(text, i)
	local j = i
	while j > i - 3 and j > 1 and text:byte(j) >= 0x80 and text:byte(j) <= 0xBF do
		j = j - 1
	end
	return j
end

local function space_before(text, i) -- the character before byte i is whitespace
	return i > 1 and SPACE[text:sub(char_start(text, i - 1), i - 1)] == true
end

local function rstrip(text)
	local i = #text
	while i > 0 and space_before(text, i + 1) do
		i = char_start(text, i) - 1
	end
	return text:sub(1, i)
end

local function strip(text) -- str.strip()
	return rstrip(lstrip(text))
end

-- Python's lower(), enough to compare with ASCII text: ASCII letters, and the Kelvin sign,
-- the one other character whose lower() is ASCII ('k'); any other stays non-ASCII.
local LOWER = {}
for b = 65, 90 do
	LOWER[string.char(b)] = string.char(b + 32)
end
local function fold(text)
	return (text:gsub("[A-Z]", LOWER):gsub("\226\132\170", "k"))
end

local function ascii_lower(text)
	return (text:gsub("[A-Z]", LOWER))
end

-- str.isprintable() above U+007F: not printable are Unicode's categories Cc Cf Cs Co Cn Zl
-- Zp and Zs; the ranges are at the end of this file, parsed on first use.
local NONPRINTABLE_TEXT
local nonprintable_first, nonprintable_last

local function printable(cp)
	if cp < 0x80 then
		return cp >= 0x20 and cp < 0x7F
	end
	if not nonprintable_first then
		nonprintable_first, nonprintable_last = {}, {}
		for first, last in NONPRINTABLE_TEXT:gmatch("([0-9A-F]+)%-?([0-9A-F]*)") do
			nonprintable_first[#nonprintable_first + 1] = tonumber(first, 16)
			nonprintable_last[#nonprintable_last + 1] = tonumber(last ~= "" and last or first, 16)
		end
	end
	local lo, hi = 1, #nonprintable_first -- the last range that starts at or before cp
	while lo < hi do
		local mid = math.floor((lo + hi + 1) / 2)
		if nonprintable_first[mid] <= cp then
			lo = mid
		else
			hi = mid - 1
		end
	end
	return not (nonprintable_first[lo] <= cp and cp <= nonprintable_last[lo])
end

-- len(text.encode("utf-8", "surrogateescape")): an escaped byte (see escaped_byte) is one.
local function encoded_length(text)
	local _, escaped = text:gsub("\237[\178\179]", "")
	return #text - 2 * escaped
end

-- Everything repr() may escape: control bytes, ' and \, and any non-ASCII character.
local SPECIAL = "[^\32-\38\40-\91%]\94-\126][\128-\191]*"

local NAMED_ESCAPES = { ["\\"] = "\\\\", ["\t"] = "\\t", ["\n"] = "\\n", ["\r"] = "\\r" }

local function escape(c, quote) -- false: c stays as it is
	if c == "'" then
		return quote == "'" and "\\'" or false
	end
	if NAMED_ESCAPES[c] then
		return NAMED_ESCAPES[c]
	end
	local cp = codepoint(c)
	if cp >= 0x80 and printable(cp) then
		return false
	elseif cp < 0x100 then
		return string.format("\\x%02x", cp)
	elseif cp < 0x10000 then
		return string.format("\\u%04x", cp)
	end
	return string.format("\\U%08x", cp)
end

-- What each character becomes in repr(), by the quote used, computed once per character:
-- gsub with a table then runs at C speed even for a long line.
local ESCAPED = {}
for _, quote in ipairs({ "'", '"' }) do
	ESCAPED[quote] = setmetatable({}, {
		__index = function(cache, c)
			local value = escape(c, quote)
			cache[c] = value
			return value
		end,
	})
end

-- Python's repr() of a str (decoded text): quotes as Python picks them, \\ \t \n \r,
-- \xNN \uNNNN \UNNNNNNNN for what is not printable, printable characters as they are.
function M.repr(text)
	local quote = "'"
	if text:find("'", 1, true) and not text:find('"', 1, true) then
		quote = '"'
	end
	return quote .. text:gsub(SPECIAL, ESCAPED[quote]) .. quote
end
local repr = M.repr

-- The lines of a script as Python's universal newlines split them (\r\n, \r or \n), each
-- with the position of its last byte in the script.
local function lines(text)
	local pos, n = 1, #text
	return function()
		if pos > n + 1 then
			return nil
		end
		local s = text:find("[\r\n]", pos)
		local line, last
		if not s then
			line, last, pos = text:sub(pos), n, n + 2
		else
			line, last = text:sub(pos, s - 1), s - 1
			pos = text:sub(s, s + 1) == "\r\n" and s + 2 or s + 1
		end
		return line, last
	end
end

-- ---------------------------------------------------------------- refusals (DirectiveError)

local Refusal = {} -- metatable that marks a refusal among Lua errors

local function refuse(problem)
	error(setmetatable({ problem = problem }, Refusal), 0)
end

local function shown(line) -- _shown: a long line is cut to 200 characters
	if length(line) <= 200 then
		return line
	end
	return first_chars(line, 200) .. "..."
end

local MAX_PROBLEM = 400 -- MAX_PROBLEM: a problem may quote a word of the line

local function cut_middle(problem) -- _cut_middle: its start and its end
	local n = length(problem)
	if n <= MAX_PROBLEM then
		return problem
	end
	local half = MAX_PROBLEM / 2
	local tail = problem:sub(#first_chars(problem, n - half) + 1)
	return first_chars(problem, half) .. "..." .. tail
end

-- _locate: where, the line (a script's) or item (a comment's) as repr() shows it, the problem.
local function locate(problem, lineno, line, origin)
	local where = origin == "script" and "script line " or (origin .. " item ")
	problem = cut_middle(problem)
	return where .. lineno .. ": " .. repr(shown(line)) .. ": " .. problem
end

-- ------------------------------------------------------------------------------ capacities

local function strip_zeros(digits)
	return digits:match("^0*([0-9].*)$") or "0"
end

local function greater(a, b) -- a > b, for decimal texts without leading zeros
	if #a ~= #b then
		return #a > #b
	end
	for i = 1, #a do -- byte by byte: Lua's a > b would use the locale's collation
		if a:byte(i) ~= b:byte(i) then
			return a:byte(i) > b:byte(i)
		end
	end
	return false
end

local function times(digits, m) -- decimal text times a small integer
	local out, carry = {}, 0
	for i = #digits, 1, -1 do
		local v = (digits:byte(i) - 48) * m + carry
		out[#out + 1] = string.char(48 + v % 10)
		carry = (v - v % 10) / 10
	end
	while carry > 0 do
		out[#out + 1] = string.char(48 + carry % 10)
		carry = (carry - carry % 10) / 10
	end
	return string.reverse(table.concat(out))
end

local function plus_one(digits)
	local head, nines = digits:match("^(.-)(9*)$")
	local last = head ~= "" and head:byte(-1) or 48
	head = head ~= "" and head:sub(1, -2) or ""
	return head .. string.char(last + 1) .. string.rep("0", #nines)
end

local function capacity_parts(text) -- _CAPACITY_RE: digits, optionally '.' digits, letters
	local number, suffix = text:match("^([0-9]+)([A-Za-z]*)$")
	if not number then
		number, suffix = text:match("^([0-9]+%.[0-9]+)([A-Za-z]*)$")
	end
	return number, suffix
end

local SUFFIX_BY_FOLDED = { [ascii_lower(NODE_SUFFIX)] = NODE_SUFFIX }
for suffix in pairs(UNITS) do
	SUFFIX_BY_FOLDED[ascii_lower(suffix)] = suffix
end

local function size_unit(text, suffix)
	if suffix == "" then
		return { 1, 0 }
	end
	if UNITS[suffix] then
		return UNITS[suffix]
	end
	local folded = SUFFIX_BY_FOLDED[ascii_lower(suffix)]
	local hint = folded and ("suffixes are case-sensitive: did you mean " .. repr(folded) .. "?")
		or "use K|KiB M|MiB G|GiB T|TiB P|PiB (1024), KB MB GB TB PB (1000), N (nodes), "
			.. "or no suffix for bytes"
	refuse("capacity " .. repr(text) .. " has an unknown suffix " .. repr(suffix) .. "; " .. hint)
end

-- parse_capacity: the size in bytes as decimal text, or a node count and true.
local function parse_capacity(text)
	local number, suffix = capacity_parts(text)
	if not number then
		refuse("capacity " .. repr(text) .. " is not a number with an optional suffix; "
			.. "give e.g. capacity=10GiB or capacity=500MB")
	end
	if #number > MAX_NUMBER_CHARS then
		refuse("capacity " .. repr(first_chars(text, 20))
			.. "... has too many digits; use a larger suffix such as GiB or TiB")
	end
	local whole, fraction = number:match("^([0-9]+)%.?([0-9]*)$")
	if suffix == NODE_SUFFIX then
		if fraction:find("[1-9]") then
			refuse("capacity " .. repr(text)
				.. ": a node count must be a whole number, e.g. capacity=2N")
		end
		local count = strip_zeros(whole)
		if count == "0" then
			refuse("capacity " .. repr(text) .. ": a node count must be at least 1")
		end
		if greater(count, MAX_BYTES) then
			refuse("capacity " .. repr(text) .. ": node count too large; give at most "
				.. MAX_BYTES .. "N")
		end
		return count, true
	end
	local unit = size_unit(text, suffix)
	if not number:find("[1-9]") then
		refuse("capacity " .. repr(text)
			.. " must be greater than zero; give a size such as capacity=10GiB")
	end
	-- ceil(whole.fraction * unit), exactly: multiply the digits, then cut the fraction's
	-- places off, rounding up if any of them is not zero.
	local digits = whole .. fraction
	for _ = 1, unit[2] do
		digits = unit[1] == 1000 and digits .. "000" or times(digits, unit[1])
	end
	local size = strip_zeros(digits:sub(1, #digits - #fraction))
	if digits:sub(#digits - #fraction + 1):find("[1-9]") then
		size = plus_one(size)
	end
	if greater(size, MAX_BYTES) then
		refuse("capacity " .. repr(text) .. " is " .. size .. " bytes, more than the maximum "
			.. MAX_BYTES .. " (2**63-1); ask for less")
	end
	return size, false
end

local function joined_capacity(text) -- text with its suffix spelt right, if a capacity
	local number, suffix = capacity_parts(text)
	if not number then
		return nil
	end
	if suffix == "" then
		return number
	end
	local canonical = SUFFIX_BY_FOLDED[ascii_lower(suffix)]
	return canonical and number .. canonical or nil
end

-- ----------------------------------------------------------------------------- stage paths

-- normalise()'s problem with a path, or nil.
local function path_problem(path)
	if path:find("\0", 1, true) or path:find("[\1-\31\127]") then
		return "path " .. repr(path) .. " contains a NUL or control character; remove it "
			.. "(check the job name, user name and working directory)"
	end
	if path:sub(1, 1) ~= "/" then
		return "path " .. repr(path)
			.. " is relative; give an absolute path (starting with / or %d)"
	end
	local parts = {}
	for part in path:gmatch("[^/]+") do
		if part ~= "." then
			parts[#parts + 1] = part
		end
	end
	if contains(parts, "..") then
		return "path " .. repr(path) .. " contains '..'; give a path without '..'"
	end
	for _, part in ipairs(parts) do
		if encoded_length(part) > NAME_MAX then -- bytes, as Python counts them
			return "path " .. repr(path) .. " has a component longer than " .. NAME_MAX
				.. " bytes; shorten it"
		end
	end
	if encoded_length("/" .. table.concat(parts, "/")) > PATH_MAX then
		return "path " .. repr(first_chars(path, 60)) .. "... is longer than " .. PATH_MAX
			.. " bytes; shorten it"
	end
	return nil
end

-- substitute() with the stand-in values: the path, or nil and the problem.
local function substitute(path)
	local out, i = {}, 1
	while true do
		local j = path:find("[%%\\]", i)
		if not j then
			out[#out + 1] = path:sub(i)
			break
		end
		out[#out + 1] = path:sub(i, j - 1)
		if path:sub(j, j + 1) == STOP then
			out[#out + 1] = path:sub(j + 2) -- the rest verbatim, the marker dropped
			break
		elseif path:sub(j, j) == "\\" then
			out[#out + 1] = "\\"
			i = j + 1
		elseif j == #path then
			return nil, "path " .. repr(path) .. " ends with a lone '%'; write '%%' for a literal %"
		else
			local letter = char_at(path, j + 1)
			if letter == "%" then
				out[#out + 1] = "%"
			elseif PLACEHOLDERS[letter] then
				out[#out + 1] = PLACEHOLDERS[letter]
			else
				local shown_symbol = printable(codepoint(letter)) and ("'%" .. letter .. "'")
					or repr("%" .. letter)
				return nil, "path " .. repr(path) .. " uses unknown symbol " .. shown_symbol
					.. "; known symbols are %% %A %a %d %j %u %x, write '%%' for a literal %"
			end
			i = j + 1 + #letter
		end
	end
	return table.concat(out)
end

local function check_stage_path(option, key)
	local raw = option.value
	if option.verbatim then
		raw = STOP .. raw
	end
	local path, problem = substitute(raw)
	problem = problem or path_problem(path)
	if problem then
		refuse(key .. "=: " .. problem)
	end
end

-- ------------------------------------------------------------------------- one directive

local function partition(token) -- str.partition("="): key, whether '=' was there, value
	local at = token:find("=", 1, true)
	if not at then
		return token, false, ""
	end
	return token:sub(1, at - 1), true, token:sub(at + 1)
end

-- _tokens: the words of the body, up to a trailing '# comment'. `apart` is _apart(origin):
-- how to keep directives apart where they came from (state.apart).
local function tokens(body, prefix, apart)
	local words, folded_prefix = {}, fold(prefix)
	for token in blanked(body):gmatch("[^ ]+") do
		if fold(token) == folded_prefix then
			-- not a comment: a second directive, which would silently do nothing
			refuse("a second " .. prefix .. " directive inside this one is not applied; " .. apart)
		end
		if token:sub(1, 1) == "#" then
			break
		end
		words[#words + 1] = token
	end
	return words
end

-- _check_spaced_equals: 'capacity= 2GiB', 'capacity =2GiB', 'capacity = 2GiB'.
local function check_spaced_equals(words)
	for i, token in ipairs(words) do
		local key, eq, value = partition(token)
		local next1, next2 = words[i + 1], words[i + 2]
		local parts
		if not VALUED[key] then
			parts = nil
		elseif eq and value == "" and next1 and not next1:find("=", 1, true) then
			parts = { token, next1 }
		elseif not eq and next1 and next1:sub(1, 1) == "=" then
			local spaced = next1 == "=" and next2 ~= nil and not next2:find("=", 1, true)
			parts = spaced and { token, next1, next2 } or { token, next1 }
		end
		if parts then
			refuse(repr(table.concat(parts, " ")) .. " has a space around '='; write "
				.. repr(table.concat(parts)))
		end
	end
end

-- _options: {key, value (nil without '='), verbatim (a STOP marker earlier on the line)}.
local function options_of(words)
	local options, stopped = {}, false
	for _, token in ipairs(words) do
		if token:find('"', 1, true) or token:find("'", 1, true) then
			refuse("quoting is not supported: values cannot contain quotes or whitespace")
		end
		local key, eq, value = partition(token)
		options[#options + 1] = { key = key, value = eq and value or nil, verbatim = stopped }
		stopped = stopped or token:find(STOP, 1, true) ~= nil
	end
	return options
end

local function unknown_verb(verb)
	local folded, hint = fold(verb), ""
	if IS_VERB[folded] then
		hint = " (directives are case-sensitive: did you mean " .. repr(folded) .. "?)"
	elseif folded:sub(1, 6) == "jobns:" then
		hint = " ('jobns:' goes once, at the start of a job comment)"
	end
	return "unknown directive " .. repr(verb) .. hint .. "; known: " .. table.concat(VERBS, ", ")
end

local function has_value(option)
	return option ~= nil and option.value ~= nil and option.value ~= ""
end

local function stray_word(verb, previous, word, usage, apart)
	if IS_VERB[word] then
		return repr(word) .. " starts another directive; " .. apart
	end
	if has_value(previous) and previous.key == "capacity" then
		local joined = joined_capacity(previous.value .. word)
		if joined then
			return "capacity " .. repr(previous.value .. " " .. word)
				.. " has a space inside; write " .. repr("capacity=" .. joined)
		end
	end
	if has_value(previous) and (previous.key == "source" or previous.key == "destination") then
		return "unexpected word " .. repr(word) .. " after " .. previous.key
			.. "=: a path cannot contain spaces; " .. usage
	end
	if verb.key == "shared_tmpdir" and verb.value == nil and LAYOUT[word] then
		return "unexpected word " .. repr(word) .. "; write " .. repr("shared_tmpdir=" .. word)
	end
	return "unexpected word " .. repr(word) .. "; " .. usage
end

-- _check_words: every word after the verb must be one of its keys.
local function check_words(verb, options, known, apart)
	local usage = "write '#JOBNS " .. USAGE[verb.key] .. "'"
	local previous
	for _, option in ipairs(options) do
		if contains(known, option.key) or (option.value == nil and option.key == STOP) then
			previous = option -- a lone marker only stops substitution
		elseif option.value == nil then
			refuse(stray_word(verb, previous, option.key, usage, apart))
		elseif option.key == "" then
			refuse(repr("=" .. option.value) .. " has no key before '='; " .. usage)
		else
			local folded, hint = fold(option.key), ""
			if contains(known, folded) then
				hint = " (keys are case-sensitive: did you mean " .. repr(folded) .. "?)"
			end
			local what = #known > 0 and usage or (verb.key .. " takes no options")
			refuse("unknown key " .. repr(option.key) .. " for " .. verb.key .. hint .. "; "
				.. what)
		end
	end
end

-- _collect: the known options by key; all of them required, none twice, each with a value.
local function collect(options, known, verb)
	local values = {}
	for _, option in ipairs(options) do
		if contains(known, option.key) then
			if values[option.key] then
				refuse(option.key .. "= is given twice; give it once")
			end
			if not has_value(option) then
				refuse(option.key .. " needs a value; write '#JOBNS " .. USAGE[verb] .. "'")
			end
			values[option.key] = option
		end
	end
	local missing = {}
	for _, key in ipairs(known) do
		if not values[key] then
			missing[#missing + 1] = key
		end
	end
	if #missing > 0 then
		refuse(verb .. " needs " .. table.concat(missing, "= and ") .. "=; write '#JOBNS "
			.. USAGE[verb] .. "'")
	end
	return values
end

local function apply(state, verb, options)
	if not IS_VERB[verb.key] then
		refuse(unknown_verb(verb.key))
	end
	if verb.value ~= nil and verb.key ~= "shared_tmpdir" then
		refuse(verb.key .. " takes no '=value'; see '#JOBNS " .. USAGE[verb.key] .. "'")
	end
	local known = KEYS[verb.key]
	check_words(verb, options, known, state.apart)
	local values = collect(options, known, verb.key)
	if verb.key == "shm" or verb.key == "tmp" then
		local text = values.capacity.value
		local _, nodes = parse_capacity(text)
		if nodes then
			refuse("capacity " .. repr(text) .. " is a node count; " .. verb.key
				.. " needs a size, e.g. capacity=2GiB")
		end
		-- Not judged: rounding to the node's granularity, and a second shm/tmp line with
		-- another size (it may round to the same).
	elseif verb.key == "shared_tmpdir" then
		local layout = verb.value == nil and "shared" or LAYOUT[verb.value]
		if not layout then
			refuse("shared_tmpdir=" .. repr(verb.value) .. " is not one of yes, per-node, no; "
				.. "write '#JOBNS " .. USAGE.shared_tmpdir .. "'")
		end
		if state.layout and state.layout ~= layout then
			refuse("shared_tmpdir contradicts an earlier shared_tmpdir (" .. repr(state.layout)
				.. "); keep one line")
		end
		state.layout = layout
	elseif verb.key == "stage_in" or verb.key == "stage_out" then
		check_stage_path(values.source, "source")
		check_stage_path(values.destination, "destination")
	end
end

-- ------------------------------------------------------------------------------ one line

local function is_header_line(line) -- blank, or a comment
	local b = blanked(line)
	return b:find("^ *#") ~= nil or b:find("^ *$") ~= nil
end

-- _directive_body: the text after #WORD if the line is a directive line, else nil.
local function directive_body(line, prefix)
	if line:sub(1, #prefix) ~= prefix then
		return nil
	end
	local rest = line:sub(#prefix + 1)
	if rest ~= "" and not SPACE[char_at(rest, 1)] then
		return nil -- '#JOBNSX' is some other directive word
	end
	return rest
end

-- _near_miss, in the header: an indented directive, or one whose word differs in case.
local function near_miss(line, prefix)
	local stripped = lstrip(line)
	local head = first_chars(stripped, #prefix) -- the prefix is ASCII: bytes = characters
	local rest = stripped:sub(#head + 1)
	if fold(head) ~= fold(prefix) or (rest ~= "" and not SPACE[char_at(rest, 1)]) then
		return
	end
	if #stripped ~= #line and head == prefix then
		refuse("indented directive is not applied; start it in column 1")
	elseif head ~= prefix then
		refuse("directive word is case-sensitive; this line is not applied, write " .. prefix)
	end
end

-- _apply_line: a directive's words (after #WORD, if it had one).
local function apply_body(state, body, prefix)
	local words = tokens(body, prefix, state.apart)
	check_spaced_equals(words)
	local options = options_of(words)
	if #options > 0 then
		apply(state, table.remove(options, 1), options)
	end
end

local function check_line(state, line, prefix)
	local body = directive_body(line, prefix)
	if body == nil then
		near_miss(line, prefix)
		return
	end
	apply_body(state, body, prefix)
end

-- check_word: the directive word as burst_buffer.conf's Directive= (a site's mistake: an
-- error, never a refusal of the user's job).
local function check_word(word)
	if word:sub(1, 1) == "#" then
		error("directive word " .. repr(M.decode(word)) .. ": give it without the leading '#'", 0)
	end
	if #word < 1 or #word > 64 or word:find("[^A-Za-z0-9_]") then
		error("directive word " .. repr(M.decode(word))
			.. " must be 1-64 letters, digits or '_'", 0)
	end
	return word
end

-- The problem parse_script(text, word) would refuse the script with, within the subset,
-- as str(DirectiveError); nil when the subset finds nothing wrong. `text` is the script's
-- bytes; `word` the directive word (default "JOBNS"), as [directives] word on the nodes.
function M.check(text, word)
	local prefix = "#" .. check_word(word == nil and DEFAULT_WORD or word)
	local state = { layout = nil, apart = "put each directive on a line of its own" }
	local lineno = 0
	for raw, last in lines(text) do
		lineno = lineno + 1
		if last > MAX_JUDGED then
			return nil
		end
		local line = M.decode(raw)
		if not is_header_line(line) then
			return nil -- after the header nothing is refused (directives there are only warned of)
		end
		local ok, err = pcall(check_line, state, line, prefix)
		if not ok then
			if getmetatable(err) ~= Refusal then
				error(err, 0)
			end
			return locate(err.problem, lineno, line, "script")
		end
	end
	return nil
end

-- ---------------------------------------------------------------------- the job comment
-- comment_directives() then parse_directives(text, source="--comment"), as the prolog's
-- gather_directives calls them on SLURM_JOB_COMMENT.

local COMMENT_PREFIX = "jobns:"
local EXAMPLE = "jobns: shm capacity=2GiB"

local function word_byte(b) -- [A-Za-z0-9_]
	return (b >= 48 and b <= 57) or (b >= 65 and b <= 90) or (b >= 97 and b <= 122) or b == 95
end

local function word_before(text, i) -- (?<![A-Za-z0-9_]) fails at byte i
	return i > 1 and word_byte(text:byte(i - 1))
end

local function space_at(text, i) -- a whitespace character (\s) starts at byte i
	return i <= #text and SPACE[char_at(text, i)] == true
end

local function past_blanks(text, i) -- the end of [ \t]* from byte i
	local _, last = text:find("^[ \t]*", i)
	return last + 1
end

-- The first (?<![A-Za-z0-9_])jobns: (_FIRST_PREFIX_RE), or nil.
local function first_prefix(text)
	local at = 1
	while true do
		local p = text:find(COMMENT_PREFIX, at, true)
		if not p or not word_before(text, p) then
			return p
		end
		at = p + 1
	end
end

-- _START_WORD_RE's group 1, \s*(jobns(?:[ \t]*[:=;]|(?=\s|$))) in any case at the start:
-- its first byte and the one after it, or nil.
local function start_word(before, low)
	local i = #before - #lstrip(before) + 1
	if low:sub(i, i + 4) ~= "jobns" then
		return nil
	end
	local j = past_blanks(before, i + 5)
	local c = before:sub(j, j)
	if c ~= "" and (":=;"):find(c, 1, true) then
		return i, j + 1
	elseif i + 5 > #before or space_at(before, i + 5) then
		return i, i + 5
	end
	return nil
end

-- The first _NEAR_PREFIX_RE, (?<![A-Za-z0-9_])jobns[ \t]*: in any case, as start_word.
local function near_prefix(before, low)
	local at = 1
	while true do
		local p = low:find("jobns", at, true)
		if not p then
			return nil
		end
		local j = past_blanks(before, p + 5)
		if not word_before(before, p) and before:sub(j, j) == ":" then
			return p, j + 1
		end
		at = p + 1
	end
end

-- (?<![A-Za-z0-9_])PREFIX(?=$|[\s;])[ \t]* where PREFIX (n bytes) is at byte p of text:
-- the byte after the match, or nil.
local function prefix_word_at(text, p, n)
	local after = p + n
	if word_before(text, p) then
		return nil
	elseif after <= #text and text:sub(after, after) ~= ";" and not space_at(text, after) then
		return nil
	end
	return past_blanks(text, after)
end

-- re.sub(folded, "; ", text): every #WORD (any case) in text, as a word, becomes "; ".
local function prefixes_replaced(text, low_prefix)
	local low, out, cursor, at = ascii_lower(text), {}, 1, 1
	while true do
		local p = low:find(low_prefix, at, true)
		if not p then
			break
		end
		local stop = prefix_word_at(text, p, #low_prefix)
		if stop then
			out[#out + 1] = text:sub(cursor, p - 1)
			out[#out + 1] = "; "
			cursor, at = stop, stop
		else
			at = p + 1
		end
	end
	out[#out + 1] = text:sub(cursor)
	return table.concat(out)
end

local function comment_error(comment, problem) -- str(CommentError(...))
	return "--comment: " .. repr(shown(strip(comment))) .. ": " .. problem
end

-- _refuse_near_misses: the CommentError for a comment meant for jobns without 'jobns:'
-- (its text before the first 'jobns:', or all of it, is `before`), or nil.
local function near_misses(comment, before, prefix)
	local low = ascii_lower(before)
	local begin, stop = start_word(before, low)
	if not begin then
		begin, stop = near_prefix(before, low)
	end
	if begin then
		local rest = strip(comment:sub(stop))
		local fixed = rest ~= "" and (lstrip(comment:sub(1, begin - 1)) .. "jobns: " .. rest)
			or EXAMPLE
		return comment_error(comment, "this looks meant for jobns, but directives follow "
			.. "'jobns:' exactly (lower case, the colon right after); write --comment "
			.. repr(shown(fixed)))
	end
	-- A pasted script line: #WORD in any case at the start, spelt exactly anywhere.
	local low_prefix, found, stop = ascii_lower(prefix), nil, nil
	local i = #before - #lstrip(before) + 1
	if low:sub(i, i + #prefix - 1) == low_prefix then
		found, stop = 1, prefix_word_at(before, i, #prefix) -- re.match: from the start
	end
	local at = 1
	while not stop do
		found = before:find(prefix, at, true)
		if not found then
			return nil
		end
		stop = prefix_word_at(before, found, #prefix)
		at = found + 1
	end
	local head = lstrip(before:sub(1, found - 1))
	local tail = strip(prefixes_replaced(before:sub(stop), low_prefix) .. comment:sub(#before + 1))
	local fixed = tail ~= "" and (head .. "jobns: " .. tail) or EXAMPLE
	return comment_error(comment, "a job comment takes directives after 'jobns:', not as "
		.. prefix .. " lines; write --comment " .. repr(shown(fixed)))
end

-- The text after the first 'jobns:', each later 'jobns:' that starts a token (at the
-- start, or after whitespace or ';': _NEXT_PREFIX_RE) made a ';'.
local function directive_text(rest)
	local out, cursor, at = {}, 1, 1
	while true do
		local p = rest:find(COMMENT_PREFIX, at, true)
		if not p then
			break
		end
		if p == 1 or rest:sub(p - 1, p - 1) == ";" or space_before(rest, p) then
			out[#out + 1] = rest:sub(cursor, p - 1)
			out[#out + 1] = ";"
			cursor = p + #COMMENT_PREFIX
		end
		at = p + #COMMENT_PREFIX
	end
	out[#out + 1] = rest:sub(cursor)
	return table.concat(out)
end

-- One item of parse_directives: `item` as split, `line` stripped (and not blank).
local function check_item(state, item, line, prefix)
	if item:sub(-1) == "\r" then -- _check_line_end
		refuse("DOS line break (\\r\\n); remove the '\\r'")
	end
	local body = directive_body(line, prefix)
	if body == nil and line:sub(1, 1) == "#" then
		refuse("not a " .. prefix .. " directive; write it without a leading '#' or as '"
			.. prefix .. " ...'")
	end
	apply_body(state, body or line, prefix)
end

-- The problem the prolog would refuse the job with for its comment (sbatch --comment
-- 'jobns: shm capacity=2GiB; shared_tmpdir'), within the subset, as str(DirectiveError);
-- nil when the subset finds nothing wrong, and for an ordinary comment. `comment` is the
-- comment's bytes (the prolog reads them from its environment: UTF-8, surrogateescape);
-- `word` as for check(), checked even where the comment does not use it. A comment longer
-- than MAX_JUDGED bytes is not judged (nil): the work stays bounded, the prolog judges it.
function M.check_comment(comment, word)
	local prefix = "#" .. check_word(word == nil and DEFAULT_WORD or word)
	if #comment > MAX_JUDGED then
		return nil
	end
	-- gather_directives' shortcut, and a fast path: every rule below needs one of these.
	local low = ascii_lower(comment)
	if not (low:find("jobns", 1, true) or low:find(ascii_lower(prefix), 1, true)) then
		return nil
	end
	local text = M.decode(comment, true)
	local first = first_prefix(text)
	local problem = near_misses(text, first and text:sub(1, first - 1) or text, prefix)
	if problem or not first then
		return problem
	end
	local items = directive_text(text:sub(first + #COMMENT_PREFIX))
	local state = { layout = nil, apart = "separate directives with ';'" }
	local lineno, pos = 0, 1
	while pos <= #items + 1 do -- re.split(r"[\n;]", items)
		local stop = items:find("[\n;]", pos) or #items + 1
		local item = items:sub(pos, stop - 1)
		lineno, pos = lineno + 1, stop + 1
		local line = strip(item)
		if line ~= "" then
			local ok, err = pcall(check_item, state, item, line, prefix)
			if not ok then
				if getmetatable(err) ~= Refusal then
					error(err, 0)
				end
				return locate(err.problem, lineno, line, "--comment")
			end
		end
	end
	return nil
end

-- Generated from Python 3.11's unicodedata (Unicode 14.0.0): the code points from U+0080 up
-- for which str.isprintable() is False, as hex ranges. test_lua_directives.py checks them.
NONPRINTABLE_TEXT = [[
80-A0 AD 378-379 380-383 38B 38D 3A2 530 557-558 58B-58C 590 5C8-5CF 5EB-5EE 5F5-605 61C 6DD
70E-70F 74B-74C 7B2-7BF 7FB-7FC 82E-82F 83F 85C-85D 85F 86B-86F 88F-897 8E2 984 98D-98E 991-992
9A9 9B1 9B3-9B5 9BA-9BB 9C5-9C6 9C9-9CA 9CF-9D6 9D8-9DB 9DE 9E4-9E5 9FF-A00 A04 A0B-A0E A11-A12
A29 A31 A34 A37 A3A-A3B A3D A43-A46 A49-A4A A4E-A50 A52-A58 A5D A5F-A65 A77-A80 A84 A8E A92 AA9
AB1 AB4 ABA-ABB AC6 ACA ACE-ACF AD1-ADF AE4-AE5 AF2-AF8 B00 B04 B0D-B0E B11-B12 B29 B31 B34
B3A-B3B B45-B46 B49-B4A B4E-B54 B58-B5B B5E B64-B65 B78-B81 B84 B8B-B8D B91 B96-B98 B9B B9D
BA0-BA2 BA5-BA7 BAB-BAD BBA-BBD BC3-BC5 BC9 BCE-BCF BD1-BD6 BD8-BE5 BFB-BFF C0D C11 C29 C3A-C3B
C45 C49 C4E-C54 C57 C5B-C5C C5E-C5F C64-C65 C70-C76 C8D C91 CA9 CB4 CBA-CBB CC5 CC9 CCE-CD4
CD7-CDC CDF CE4-CE5 CF0 CF3-CFF D0D D11 D45 D49 D50-D53 D64-D65 D80 D84 D97-D99 DB2 DBC DBE-DBF
DC7-DC9 DCB-DCE DD5 DD7 DE0-DE5 DF0-DF1 DF5-E00 E3B-E3E E5C-E80 E83 E85 E8B EA4 EA6 EBE-EBF EC5
EC7 ECE-ECF EDA-EDB EE0-EFF F48 F6D-F70 F98 FBD FCD FDB-FFF 10C6 10C8-10CC 10CE-10CF 1249
124E-124F 1257 1259 125E-125F 1289 128E-128F 12B1 12B6-12B7 12BF 12C1 12C6-12C7 12D7 1311
1316-1317 135B-135C 137D-137F 139A-139F 13F6-13F7 13FE-13FF 1680 169D-169F 16F9-16FF 1716-171E
1737-173F 1754-175F 176D 1771 1774-177F 17DE-17DF 17EA-17EF 17FA-17FF 180E 181A-181F 1879-187F
18AB-18AF 18F6-18FF 191F 192C-192F 193C-193F 1941-1943 196E-196F 1975-197F 19AC-19AF 19CA-19CF
19DB-19DD 1A1C-1A1D 1A5F 1A7D-1A7E 1A8A-1A8F 1A9A-1A9F 1AAE-1AAF 1ACF-1AFF 1B4D-1B4F 1B7F
1BF4-1BFB 1C38-1C3A 1C4A-1C4C 1C89-1C8F 1CBB-1CBC 1CC8-1CCF 1CFB-1CFF 1F16-1F17 1F1E-1F1F
1F46-1F47 1F4E-1F4F 1F58 1F5A 1F5C 1F5E 1F7E-1F7F 1FB5 1FC5 1FD4-1FD5 1FDC 1FF0-1FF1 1FF5
1FFF-200F 2028-202F 205F-206F 2072-2073 208F 209D-209F 20C1-20CF 20F1-20FF 218C-218F 2427-243F
244B-245F 2B74-2B75 2B96 2CF4-2CF8 2D26 2D28-2D2C 2D2E-2D2F 2D68-2D6E 2D71-2D7E 2D97-2D9F 2DA7
2DAF 2DB7 2DBF 2DC7 2DCF 2DD7 2DDF 2E5E-2E7F 2E9A 2EF4-2EFF 2FD6-2FEF 2FFC-3000 3040 3097-3098
3100-3104 3130 318F 31E4-31EF 321F A48D-A48F A4C7-A4CF A62C-A63F A6F8-A6FF A7CB-A7CF A7D2 A7D4
A7DA-A7F1 A82D-A82F A83A-A83F A878-A87F A8C6-A8CD A8DA-A8DF A954-A95E A97D-A97F A9CE A9DA-A9DD
A9FF AA37-AA3F AA4E-AA4F AA5A-AA5B AAC3-AADA AAF7-AB00 AB07-AB08 AB0F-AB10 AB17-AB1F AB27 AB2F
AB6C-AB6F ABEE-ABEF ABFA-ABFF D7A4-D7AF D7C7-D7CA D7FC-F8FF FA6E-FA6F FADA-FAFF FB07-FB12
FB18-FB1C FB37 FB3D FB3F FB42 FB45 FBC3-FBD2 FD90-FD91 FDC8-FDCE FDD0-FDEF FE1A-FE1F FE53 FE67
FE6C-FE6F FE75 FEFD-FF00 FFBF-FFC1 FFC8-FFC9 FFD0-FFD1 FFD8-FFD9 FFDD-FFDF FFE7 FFEF-FFFB
FFFE-FFFF 1000C 10027 1003B 1003E 1004E-1004F 1005E-1007F 100FB-100FF 10103-10106 10134-10136
1018F 1019D-1019F 101A1-101CF 101FE-1027F 1029D-1029F 102D1-102DF 102FC-102FF 10324-1032C
1034B-1034F 1037B-1037F 1039E 103C4-103C7 103D6-103FF 1049E-1049F 104AA-104AF 104D4-104D7
104FC-104FF 10528-1052F 10564-1056E 1057B 1058B 10593 10596 105A2 105B2 105BA 105BD-105FF
10737-1073F 10756-1075F 10768-1077F 10786 107B1 107BB-107FF 10806-10807 10809 10836 10839-1083B
1083D-1083E 10856 1089F-108A6 108B0-108DF 108F3 108F6-108FA 1091C-1091E 1093A-1093E 10940-1097F
109B8-109BB 109D0-109D1 10A04 10A07-10A0B 10A14 10A18 10A36-10A37 10A3B-10A3E 10A49-10A4F
10A59-10A5F 10AA0-10ABF 10AE7-10AEA 10AF7-10AFF 10B36-10B38 10B56-10B57 10B73-10B77 10B92-10B98
10B9D-10BA8 10BB0-10BFF 10C49-10C7F 10CB3-10CBF 10CF3-10CF9 10D28-10D2F 10D3A-10E5F 10E7F 10EAA
10EAE-10EAF 10EB2-10EFF 10F28-10F2F 10F5A-10F6F 10F8A-10FAF 10FCC-10FDF 10FF7-10FFF 1104E-11051
11076-1107E 110BD 110C3-110CF 110E9-110EF 110FA-110FF 11135 11148-1114F 11177-1117F 111E0
111F5-111FF 11212 1123F-1127F 11287 11289 1128E 1129E 112AA-112AF 112EB-112EF 112FA-112FF 11304
1130D-1130E 11311-11312 11329 11331 11334 1133A 11345-11346 11349-1134A 1134E-1134F 11351-11356
11358-1135C 11364-11365 1136D-1136F 11375-113FF 1145C 11462-1147F 114C8-114CF 114DA-1157F
115B6-115B7 115DE-115FF 11645-1164F 1165A-1165F 1166D-1167F 116BA-116BF 116CA-116FF 1171B-1171C
1172C-1172F 11747-117FF 1183C-1189F 118F3-118FE 11907-11908 1190A-1190B 11914 11917 11936
11939-1193A 11947-1194F 1195A-1199F 119A8-119A9 119D8-119D9 119E5-119FF 11A48-11A4F 11AA3-11AAF
11AF9-11BFF 11C09 11C37 11C46-11C4F 11C6D-11C6F 11C90-11C91 11CA8 11CB7-11CFF 11D07 11D0A
11D37-11D39 11D3B 11D3E 11D48-11D4F 11D5A-11D5F 11D66 11D69 11D8F 11D92 11D99-11D9F 11DAA-11EDF
11EF9-11FAF 11FB1-11FBF 11FF2-11FFE 1239A-123FF 1246F 12475-1247F 12544-12F8F 12FF3-12FFF
1342F-143FF 14647-167FF 16A39-16A3F 16A5F 16A6A-16A6D 16ABF 16ACA-16ACF 16AEE-16AEF 16AF6-16AFF
16B46-16B4F 16B5A 16B62 16B78-16B7C 16B90-16E3F 16E9B-16EFF 16F4B-16F4E 16F88-16F8E 16FA0-16FDF
16FE5-16FEF 16FF2-16FFF 187F8-187FF 18CD6-18CFF 18D09-1AFEF 1AFF4 1AFFC 1AFFF 1B123-1B14F
1B153-1B163 1B168-1B16F 1B2FC-1BBFF 1BC6B-1BC6F 1BC7D-1BC7F 1BC89-1BC8F 1BC9A-1BC9B 1BCA0-1CEFF
1CF2E-1CF2F 1CF47-1CF4F 1CFC4-1CFFF 1D0F6-1D0FF 1D127-1D128 1D173-1D17A 1D1EB-1D1FF 1D246-1D2DF
1D2F4-1D2FF 1D357-1D35F 1D379-1D3FF 1D455 1D49D 1D4A0-1D4A1 1D4A3-1D4A4 1D4A7-1D4A8 1D4AD 1D4BA
1D4BC 1D4C4 1D506 1D50B-1D50C 1D515 1D51D 1D53A 1D53F 1D545 1D547-1D549 1D551 1D6A6-1D6A7
1D7CC-1D7CD 1DA8C-1DA9A 1DAA0 1DAB0-1DEFF 1DF1F-1DFFF 1E007 1E019-1E01A 1E022 1E025 1E02B-1E0FF
1E12D-1E12F 1E13E-1E13F 1E14A-1E14D 1E150-1E28F 1E2AF-1E2BF 1E2FA-1E2FE 1E300-1E7DF 1E7E7 1E7EC
1E7EF 1E7FF 1E8C5-1E8C6 1E8D7-1E8FF 1E94C-1E94F 1E95A-1E95D 1E960-1EC70 1ECB5-1ED00 1ED3E-1EDFF
1EE04 1EE20 1EE23 1EE25-1EE26 1EE28 1EE33 1EE38 1EE3A 1EE3C-1EE41 1EE43-1EE46 1EE48 1EE4A 1EE4C
1EE50 1EE53 1EE55-1EE56 1EE58 1EE5A 1EE5C 1EE5E 1EE60 1EE63 1EE65-1EE66 1EE6B 1EE73 1EE78 1EE7D
1EE7F 1EE8A 1EE9C-1EEA0 1EEA4 1EEAA 1EEBC-1EEEF 1EEF2-1EFFF 1F02C-1F02F 1F094-1F09F 1F0AF-1F0B0
1F0C0 1F0D0 1F0F6-1F0FF 1F1AE-1F1E5 1F203-1F20F 1F23C-1F23F 1F249-1F24F 1F252-1F25F 1F266-1F2FF
1F6D8-1F6DC 1F6ED-1F6EF 1F6FD-1F6FF 1F774-1F77F 1F7D9-1F7DF 1F7EC-1F7EF 1F7F1-1F7FF 1F80C-1F80F
1F848-1F84F 1F85A-1F85F 1F888-1F88F 1F8AE-1F8AF 1F8B2-1F8FF 1FA54-1FA5F 1FA6E-1FA6F 1FA75-1FA77
1FA7D-1FA7F 1FA87-1FA8F 1FAAD-1FAAF 1FABB-1FABF 1FAC6-1FACF 1FADA-1FADF 1FAE8-1FAEF 1FAF7-1FAFF
1FB93 1FBCB-1FBEF 1FBFA-1FFFF 2A6E0-2A6FF 2B739-2B73F 2B81E-2B81F 2CEA2-2CEAF 2EBE1-2F7FF
2FA1E-2FFFF 3134B-E00FF E01F0-10FFFF
]]

return M
