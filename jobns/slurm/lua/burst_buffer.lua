--[[
jobns's burst_buffer.lua, for Slurm's BurstBufferType=burst_buffer/lua (22.05, 24.11,
26.05). The jobns package installs it as /usr/share/jobns/slurm/lua/burst_buffer.lua; Slurm
reads it as burst_buffer.lua beside slurm.conf (docs/admin.md "The burst buffer").

A job asks for it with Slurm's directive (#BB_LUA, or sbatch --bb), and for space in its
shared tmpdir with `#BB_LUA pool=shared capacity=SIZE` beside `#JOBNS shared_tmpdir`:

  at submission  slurm_bb_job_process (in slurmctld) checks its #JOBNS lines and (24.11
                 and later: 22.05 gives no job_info) its comment's directives: a mistake
                 refuses the job with jobns's one-line message naming the line;
  before its     setup and data_in (in slurmscriptd) run `jobns bb setup` and `jobns bb
  nodes          data-in`: the directives checked in full, the shared tmpdir made, the
                 stage_in copies into it made as the job's user; Slurm allocates the
                 nodes only after that, so a slow stage-in holds no node;
  on the nodes   the prolog reads what the burst buffer recorded (directives, --tmp, the
                 copies done) and does the per-node part, staging nothing twice;
  after the job  data_out and job_teardown run `jobns bb data-out` and `jobns bb
                 teardown`: the stage_out copies, then the shared tmpdir removed.

slurmctld calls slurm_bb_job_process, slurm_bb_pools and slurm_bb_paths itself, holding
its locks: they must not fork, block or fail the controller, so they are pure Lua (the
check is jobns_directives.lua; the pool is read from a file `jobns bb` writes). The other
functions run in slurmscriptd, as SlurmUser: they run jobns by fork and exec (luaposix:
Debian's lua-posix), each argument its own word, no shell; a SlurmUser other than root
goes through `sudo -n` (docs/admin.md gives the sudoers line). jobns's own one-line
message becomes Slurm's (the job's reason, `scontrol show job`). Slurm reloads this file
for every call: nothing survives between calls.
--]]

-- Where the jobns package puts its files (a site that moved them edits these lines).
local JOBNS_LUA_DIR = "/usr/share/jobns/slurm/lua"
local JOBNS = "/opt/jobns/venv/bin/jobns"
local SUDO = "/usr/bin/sudo"
-- What `jobns bb` writes for slurm_bb_pools: <state_dir>/bb/pools.json.
local POOLS_FILE = "/run/jobns/bb/pools.json"
local POOL = "shared" -- the pool `jobns bb pools` measures (launcher.burstbuffer.record.POOL)
-- The largest script read at submission (Slurm's own default limit is 4 MiB).
local MAX_SCRIPT = 4 * 1024 * 1024
-- The most of jobns's output kept as Slurm's message.
local MAX_OUTPUT = 64 * 1024

local function read_file(path, limit)
	local f = io.open(path, "rb")
	if f == nil then
		return nil
	end
	local text = f:read(limit)
	f:close()
	return text or ""
end

local function read_script(path)
	return read_file(path, MAX_SCRIPT)
end

local function last_line(text)
	local last = nil
	for line in string.gmatch(text, "[^\n]+") do
		if string.match(line, "%S") then
			last = line
		end
	end
	return last
end

-- Run `jobns bb ARGS...` (fork, exec; no shell) and wait for it. One pipe, read to its
-- end: its stderr (its one-line message), and for status its stdout too (otherwise
-- /dev/null: on 24.11 and later a step's output would become Slurm's message), so a
-- full pipe can never stall it while we read another. slurm.SUCCESS and what it wrote,
-- or slurm.ERROR and its last line.
local function jobns_bb(args, want_stdout)
	local ok, unistd = pcall(require, "posix.unistd")
	local ok2, wait = pcall(require, "posix.sys.wait")
	local ok3, fcntl = pcall(require, "posix.fcntl")
	if not (ok and ok2 and ok3) then
		return slurm.ERROR, "jobns: burst_buffer.lua needs luaposix on the controller (Debian: apt-get install lua-posix)"
	end
	local argv = { "bb" }
	for _, a in ipairs(args) do
		argv[#argv + 1] = tostring(a)
	end
	local program = JOBNS
	if unistd.geteuid() ~= 0 then
		table.insert(argv, 1, JOBNS)
		table.insert(argv, 1, "-n")
		program = SUDO
	end
	local r, w = unistd.pipe()
	if r == nil then
		return slurm.ERROR, "jobns: burst_buffer.lua: pipe failed"
	end
	local pid = unistd.fork()
	if pid == nil then
		return slurm.ERROR, "jobns: burst_buffer.lua: fork failed"
	end
	if pid == 0 then
		local null = fcntl.open("/dev/null", fcntl.O_RDWR)
		unistd.dup2(null, 0)
		unistd.dup2(want_stdout and w or null, 1)
		unistd.dup2(w, 2)
		unistd.close(r)
		unistd.close(w)
		unistd.close(null)
		argv[0] = program
		unistd.exec(program, argv)
		unistd._exit(127)
	end
	unistd.close(w)
	-- Read to the end, keeping at most MAX_OUTPUT.
	local parts, size = {}, 0
	while true do
		local chunk = unistd.read(r, 65536)
		if chunk == nil or #chunk == 0 then
			break
		end
		if size < MAX_OUTPUT then
			parts[#parts + 1] = chunk
			size = size + #chunk
		end
	end
	unistd.close(r)
	local out = table.concat(parts)
	local _, how, status = wait.wait(pid)
	if how == "exited" and status == 0 then
		if not want_stdout then -- its warnings, for slurmctld's log
			for line in string.gmatch(out, "[^\n]+") do
				slurm.log_info("%s", line)
			end
		end
		return slurm.SUCCESS, out
	end
	local said = out
	for line in string.gmatch(said, "[^\n]+") do
		slurm.log_error("%s", line)
	end
	local why = last_line(said) or string.format("jobns bb %s: %s %s", tostring(args[#args]), tostring(how), tostring(status))
	return slurm.ERROR, why
end

-- A step's result for Slurm: no message on success (24.11 and later would show it).
local function step(args)
	local rc, msg = jobns_bb(args)
	if rc == slurm.SUCCESS then
		return slurm.SUCCESS
	end
	return rc, msg
end

-- The header's lines within the first 64 KiB (the checker's bound: slurmctld holds its
-- locks while this runs; `jobns bb setup` reads the rest).
local function header_lines(text)
	local out = {}
	for line in string.gmatch(string.sub(text, 1, 65536), "([^\n]*)\n?") do
		local stripped = string.match(line, "^%s*(.-)%s*$")
		if stripped ~= "" and string.sub(stripped, 1, 1) ~= "#" then
			break
		end
		out[#out + 1] = stripped
	end
	return out
end

-- Does the job reserve space (#BB_LUA ... capacity=) and say shared_tmpdir (the shared
-- layout: neither =no nor =per-node)? A subset, like the directive check: `jobns bb
-- setup` checks it in full.
local function capacity_without_shared(text, comment)
	local capacity, shared = false, false
	-- Whole words only, up to a '#' that starts a word (the rest is a remark).
	local function says_shared(s)
		for word in string.gmatch(s, "[^%s;]+") do
			if string.sub(word, 1, 1) == "#" then
				break
			end
			if word == "shared_tmpdir" or word == "shared_tmpdir=yes" then
				shared = true
			end
		end
	end
	for _, line in ipairs(header_lines(text)) do
		if string.match(line, "^#BB_LUA") and string.find(line, "capacity=", 1, true) then
			capacity = true
		elseif string.match(line, "^#JOBNS%s") then
			says_shared(string.gsub(line, "^#JOBNS", "", 1))
		end
	end
	if comment ~= nil and string.find(string.lower(comment), "jobns:", 1, true) then
		says_shared(string.gsub(comment, "^.-[Jj][Oo][Bb][Nn][Ss]:", "", 1))
	end
	return capacity and not shared
end

-- At submission (in slurmctld): refuse a job whose directives the subset finds wrong.
-- 22.05 passes only the script's path; later releases add uid, gid and job_info.
function slurm_bb_job_process(job_script, uid, gid, job_info)
	local ok, checker = pcall(dofile, JOBNS_LUA_DIR .. "/jobns_directives.lua")
	if not ok then
		-- The site's install is broken, not the job: say so in the log, take the job
		-- (`jobns bb setup` checks the directives again).
		slurm.log_error("jobns: cannot load %s/jobns_directives.lua: %s", JOBNS_LUA_DIR, tostring(checker))
		return slurm.SUCCESS
	end
	local problem = nil
	local comment = nil
	if job_info ~= nil then
		comment = job_info.comment
	end
	if comment ~= nil then
		problem = checker.check_comment(comment, "JOBNS")
	end
	local text = read_script(job_script)
	if problem == nil and text ~= nil then
		problem = checker.check(text, "JOBNS")
	end
	if problem == nil and text ~= nil and capacity_without_shared(text, comment) then
		problem = "#BB_LUA pool=" .. POOL .. " capacity= reserves space in the job's shared tmpdir: add '#JOBNS shared_tmpdir' or drop capacity="
	end
	if problem ~= nil then
		return slurm.ERROR, "jobns: " .. problem
	end
	return slurm.SUCCESS
end

-- In slurmctld, every 30 s: the pool `jobns bb` measured last. Before the first
-- measurement (or where [burst_buffer] is not enabled) no pool: Slurm refuses a job
-- that asks for space in one at sbatch, rather than keep it waiting for nothing.
function slurm_bb_pools()
	local text = read_file(POOLS_FILE, MAX_OUTPUT)
	if text == nil or text == "" then
		return slurm.SUCCESS, '{"pools":[]}'
	end
	return slurm.SUCCESS, text
end

-- Slurm's arguments, 22.05's and later ones': (job_id, ..., uid, gid, job_info).
function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script, job_info)
	local args = { "--job-id", job_id, "--uid", uid, "--gid", gid, "--script", job_script }
	if pool == POOL then
		args[#args + 1] = "--size"
		args[#args + 1] = bb_size
	end
	if job_info ~= nil then
		local function add(flag, value)
			if value ~= nil then
				args[#args + 1] = flag
				args[#args + 1] = tostring(value)
			end
		end
		add("--comment", job_info.comment)
		add("--work-dir", job_info.work_dir)
		add("--job-name", job_info.name)
		add("--tmp-mib", job_info.pn_min_tmp_disk)
		add("--array-job-id", job_info.array_job_id)
		add("--array-task-id", job_info.array_task_id)
	else
		args[#args + 1] = "--ask-slurm" -- 22.05: no job_info
	end
	args[#args + 1] = "setup"
	return step(args)
end

function slurm_bb_data_in(job_id, job_script, uid, gid, job_info)
	return step({ "--job-id", job_id, "data-in" })
end

function slurm_bb_data_out(job_id, job_script, uid, gid, job_info)
	return step({ "--job-id", job_id, "data-out" })
end

function slurm_bb_job_teardown(job_id, job_script, hurry, uid, gid)
	local args = { "--job-id", job_id }
	if hurry == "true" then
		args[#args + 1] = "--hurry"
	end
	args[#args + 1] = "teardown"
	return step(args)
end

-- scontrol show bbstat: the pool and each job's buffer.
function slurm_bb_get_status(...)
	local rc, out = jobns_bb({ "status" }, true)
	if rc ~= slurm.SUCCESS then
		return slurm.SUCCESS, "jobns burst buffer: " .. tostring(out) .. "\n"
	end
	return slurm.SUCCESS, out
end

-- The rest succeed and do nothing: data_in copies synchronously (bounded by [staging]
-- timeout, which StageInTimeout must exceed), so there is nothing to poll; the size is
-- what was asked; paths (in slurmctld) adds nothing; pre_run and post_run are the
-- prolog's and the epilog's. Slurm requires each to exist (22.05 calls all but the two
-- test_data_* ones).
for _, name in ipairs({
	"slurm_bb_paths", "slurm_bb_test_data_in", "slurm_bb_real_size", "slurm_bb_pre_run",
	"slurm_bb_post_run", "slurm_bb_test_data_out",
}) do
	_G[name] = function()
		return slurm.SUCCESS
	end
end
