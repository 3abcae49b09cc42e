--[[
jobns's burst_buffer.lua, for Slurm's BurstBufferType=burst_buffer/lua (22.05, 24.11,
26.05). The jobns package installs it as /usr/share/jobns/slurm/lua/burst_buffer.lua; Slurm
reads it as burst_buffer.lua beside slurm.conf (docs/admin.md "Checked at submission").

What it does today: a job that asks for the burst buffer (a #BB_LUA line, Slurm's
directive, or sbatch/salloc/srun --bb) has its #JOBNS lines and its job comment's
directives (24.11 and later: 22.05 gives this function no job_info) checked when it is
submitted, so a mistake is refused by sbatch with jobns's one-line message naming the
line, before the job waits in the queue. The node's prolog sets the job up and stages
its data as on any other cluster; every other function succeeds and does nothing.

slurmctld calls slurm_bb_job_process, slurm_bb_pools and slurm_bb_paths itself, holding
its locks: they must not fork, block or fail the controller, so they are pure Lua
(jobns_directives.lua, a subset of jobns's checker that reads only the script's text;
the prolog checks everything again). The other functions run in slurmscriptd.
Slurm reloads this file for every call: nothing survives between calls.
--]]

-- Where the jobns package puts the checker (a site that moved it edits this line).
local JOBNS_LUA_DIR = "/usr/share/jobns/slurm/lua"
-- The largest script read at submission (Slurm's own default limit is 4 MiB).
local MAX_SCRIPT = 4 * 1024 * 1024

local function read_script(path)
	local f = io.open(path, "rb")
	if f == nil then
		return nil
	end
	local text = f:read(MAX_SCRIPT)
	f:close()
	return text or ""
end

-- At submission (in slurmctld): refuse a job whose #JOBNS lines the subset finds wrong.
-- 22.05 passes only the script's path; later releases add uid, gid and job_info.
function slurm_bb_job_process(job_script, uid, gid, job_info)
	local ok, checker = pcall(dofile, JOBNS_LUA_DIR .. "/jobns_directives.lua")
	if not ok then
		-- The site's install is broken, not the job: say so in the log, take the job
		-- (its prolog checks the directives again).
		slurm.log_error("jobns: cannot load %s/jobns_directives.lua: %s", JOBNS_LUA_DIR, tostring(checker))
		return slurm.SUCCESS
	end
	local problem = nil
	-- The job comment, which the prolog applies (24.11 and later hand it over in
	-- job_info; on 22.05 the job_submit.lua snippet checks it).
	if job_info ~= nil and job_info.comment ~= nil then
		problem = checker.check_comment(job_info.comment, "JOBNS")
	end
	if problem == nil then
		local text = read_script(job_script)
		if text ~= nil then
			problem = checker.check(text, "JOBNS")
		end
	end
	if problem ~= nil then
		return slurm.ERROR, "jobns: " .. problem
	end
	return slurm.SUCCESS
end

-- No pools yet: Slurm then charges nothing and makes no job wait for space.
function slurm_bb_pools()
	return slurm.SUCCESS
end

-- The rest (slurm_bb_paths in slurmctld, the others in slurmscriptd) succeed and do
-- nothing: the node's prolog and epilog set the job up and stage its data (docs/admin.md).
-- Slurm requires each to exist (22.05 calls all but the two test_data_* ones).
for _, name in ipairs({
	"slurm_bb_paths", "slurm_bb_setup", "slurm_bb_data_in", "slurm_bb_test_data_in",
	"slurm_bb_real_size", "slurm_bb_pre_run", "slurm_bb_post_run", "slurm_bb_data_out",
	"slurm_bb_test_data_out", "slurm_bb_job_teardown",
}) do
	_G[name] = function()
		return slurm.SUCCESS
	end
end

-- scontrol show bbstat
function slurm_bb_get_status(...)
	return slurm.SUCCESS, "jobns: #JOBNS directives are checked at submission; the node's prolog stages data\n"
end
