--[[
The submission-time check of #JOBNS directives for Slurm's job_submit/lua
(JobSubmitPlugins=lua), for every cluster: one that runs another burst-buffer plugin (only
one is allowed), and one whose jobs do not ask for jobns's burst_buffer.lua. The jobns
package installs it as /usr/share/jobns/slurm/lua/job_submit_jobns.lua; a site's
job_submit.lua calls it (docs/admin.md "Checked at submission"):

    local jobns = dofile("/usr/share/jobns/slurm/lua/job_submit_jobns.lua")
    function slurm_job_submit(job_desc, part_list, submit_uid)
        local rc = jobns.job_submit(job_desc)
        if rc ~= slurm.SUCCESS then return rc end
        -- the site's own rules
        return slurm.SUCCESS
    end

A job whose comment directives (sbatch/salloc/srun --comment 'jobns: ...', what the
prolog applies) or batch-script #JOBNS lines jobns_directives.lua finds wrong (a subset of
jobns's checker that reads only the text: slurmctld runs this, holding its locks) is
refused with jobns's one-line message naming the item or line; sbatch, salloc and srun
print it.
--]]

local JOBNS_LUA_DIR = "/usr/share/jobns/slurm/lua"
local checker = dofile(JOBNS_LUA_DIR .. "/jobns_directives.lua")

local M = {}

function M.job_submit(job_desc)
	local problem = nil
	local comment = job_desc.comment
	if comment ~= nil and comment ~= "" then
		problem = checker.check_comment(comment, "JOBNS")
	end
	local script = job_desc.script
	if problem == nil and script ~= nil and script ~= "" then
		problem = checker.check(script, "JOBNS")
	end
	if problem ~= nil then
		-- "%s": the message is the user's text, never a format
		slurm.log_user("%s", "jobns: " .. problem)
		return slurm.ERROR
	end
	return slurm.SUCCESS
end

return M
